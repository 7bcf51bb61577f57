"""Each Envoy its own native filters library: the control plane's node classes.

With `native_filters.module: node` (the default), an Envoy whose bootstrap names the
path of sluicegate's native filters library on its machine (node metadata, written by
`sluicegate up` and `sluicegate bootstrap --native-module`) is served listeners and
filter configurations that load that library; an Envoy that names none gets Envoy's own filters
(docs/native-filters.md, "Turning it on"). The Envoys naming one path form a class of
the snapshot cache (xds.server.NodeClasses) with a snapshot of its own: the default
snapshot with its clusters (their forwarded headers filter), listeners and the fast lane's
filter configurations (ECDS) translated again for that path (translate.NATIVE_TYPES;
nothing else differs).

An Envoy that rejects (NACKs) its class's clusters, listeners or filter configurations
because it cannot load a dynamic module is moved to Envoy's own filters, and the pair (node,
path) is remembered as refused until that node id connects again with no ADS stream left
open (a new Envoy process, or a reconnect: it is given its library again): so a wrong
path costs one NACK per fresh connection, never an Envoy without listeners. With any
other setting every Envoy gets the default snapshot, which names the library the setting
names, or none.

An Envoy that restarts again and again while it loads its library may be crashing in it
(a crash in a module takes Envoy down, and `up` restarts it on the same configuration):
a node id that connects anew (no ADS stream of it left open: a restart, or a reconnect
of the same process) CRASH_STARTS times within CRASH_WINDOW_S, each time given its
library, gets Envoy's own filters until its first fresh connection after CRASH_HOLD_S,
whatever the cause (the safe side: Envoy's filters do what the library does, at a
higher cost). A control plane that restarts forgets all of this.

Node metadata is what any xDS client says of itself, so it is bounded: a path must be
absolute, printable and at most MAX_PATH_CHARS long (envoy.declared_native_module), and
at most MAX_LIBRARIES distinct libraries get classes (each costs a translation of the
changed routes' clusters, the listeners and filter configurations on every change); a
node naming another beyond them gets Envoy's own filters.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from sluicegate.config import NATIVE_NODE
from sluicegate.envoy import declared_native_module
from sluicegate.model import Gateway
from sluicegate.xds.resource import EXTENSION_CONFIG
from sluicegate.xds.server import InconsistentSnapshot, Snapshot, SnapshotCache
from sluicegate.xds.translate import NATIVE_TYPES, RouteMemo, translate_native

log = logging.getLogger("sluicegate.control_plane")

MAX_LIBRARIES: Final = 16
# Envoy's words (in lower case) for a library it cannot use (nacked).
REFUSED_WORDS: Final = ("failed to load dynamic module", "failed to initialize dynamic module")
MAX_REFUSED: Final = 1024
# Four starts in a minute (three restarts: `up`'s backoff restarts a crashing Envoy
# within a second or two) and the library is held off for an hour.
CRASH_STARTS: Final = 4
CRASH_WINDOW_S: Final = 60.0
CRASH_HOLD_S: Final = 3600.0


class NativeNodes:
    """The node classes of Envoys that name their native filters library (NodeClasses)."""

    def __init__(self, cache: SnapshotCache) -> None:
        self._cache = cache
        self._setting: str | None = None
        self._base: tuple[Snapshot, Gateway] | None = None
        # path -> (the default's versions of NATIVE_TYPES it was made from, its resources
        # of those types)
        self._native: dict[str, tuple[tuple[str, ...], Snapshot]] = {}
        # path -> its unchanged routes' clusters, as the default translation keeps them
        self._memos: dict[str, RouteMemo] = {}
        # (node id, path) -> why the node fell back to Envoy's filters (Envoy's NACK, or
        # its restarts), for /status
        self.refused: dict[tuple[str, str], str] = {}
        # (node id, path) -> until when its restarts hold the library off (monotonic s)
        self._held: dict[tuple[str, str], float] = {}
        # (node id, path) -> when it connected anew lately, in its library's class
        self._starts: dict[tuple[str, str], deque[float]] = {}
        self._clock: Callable[[], float] = time.monotonic
        cache.sort_nodes_by(self)

    def publish(self, snapshot: Snapshot, model: Gateway, setting: str) -> None:
        """The default snapshot `snapshot` (of `model`) was published under `setting`
        (native_filters.module): publish every class's."""
        self._base = (snapshot, model)
        self._setting = setting
        classes = self._cache.node_classes()
        for gone in set(self._native) - classes:
            del self._native[gone]
            self._memos.pop(gone, None)
        for path in sorted(classes):
            made = self.snapshot_of(path)
            if made is None:
                continue
            try:
                self._cache.set_class_snapshot(path, made)
            except InconsistentSnapshot as error:  # as the default was not: not expected
                log.error("native filters: the resources for %r not published: %s", path, error)

    # ----- NodeClasses ---------------------------------------------------------------

    def class_of(self, node: Any, first: bool) -> str | None:
        path = declared_native_module(node)
        if path is None:
            return None
        key = (node.id, path)
        if self._held_off(key):
            return None
        if first:
            self.refused.pop(key, None)  # a new Envoy process, maybe fixed
        if key in self.refused:
            return None
        known = self._cache.node_classes()
        if path not in known and len(known) >= MAX_LIBRARIES:
            log.warning("node %r names a native filters library beyond the %d served: "
                        "Envoy's own filters for it", node.id, MAX_LIBRARIES)  # fmt: skip
            return None
        if first and self._setting == NATIVE_NODE and self._restarting(key):
            return None
        return path

    def _held_off(self, key: tuple[str, str]) -> bool:
        """Its restarts hold the library off still (an expired hold is dropped)."""
        until = self._held.get(key)
        if until is not None and until <= self._clock():
            del self._held[key]
            self.refused.pop(key, None)
            return False
        return until is not None

    def _restarting(self, key: tuple[str, str]) -> bool:
        """Note a fresh start of `key`; True (and the library held off) at CRASH_STARTS
        within CRASH_WINDOW_S."""
        now = self._clock()
        for held, until in list(self._held.items()):
            if until <= now:
                del self._held[held]
        if key not in self._starts and len(self._starts) >= MAX_REFUSED:
            self._starts.pop(next(iter(self._starts)))
        starts = self._starts.setdefault(key, deque(maxlen=CRASH_STARTS))
        starts.append(now)
        if len(starts) < CRASH_STARTS or now - starts[0] > CRASH_WINDOW_S:
            return False
        del self._starts[key]
        if len(self._held) >= MAX_REFUSED:
            self._held.pop(next(iter(self._held)))
        self._held[key] = now + CRASH_HOLD_S
        why = (f"connected anew {CRASH_STARTS} times within {CRASH_WINDOW_S:g} s with this "
               f"library: Envoy's own filters for {CRASH_HOLD_S:g} s")  # fmt: skip
        self._refuse(key, why)
        log.warning("node %r restarts again and again with the native filters library %r: "
                    "Envoy's own filters for it for %g s", *key, CRASH_HOLD_S)  # fmt: skip
        return True

    def _refuse(self, key: tuple[str, str], why: str) -> None:
        if key not in self.refused and len(self.refused) >= MAX_REFUSED:
            self.refused.pop(next(iter(self.refused)))
        self.refused[key] = why

    def snapshot_of(self, node_class: str) -> Snapshot | None:
        if self._base is None:
            return None
        snapshot, model = self._base
        if self._setting != NATIVE_NODE:
            return snapshot
        versions = tuple(snapshot.version(type_url) for type_url in NATIVE_TYPES)
        native = self._native.get(node_class)
        if native is None or native[0] != versions:
            memo = self._memos.setdefault(node_class, RouteMemo())
            translated = translate_native(
                dataclasses.replace(model, native_module=node_class), memo
            )
            native = (versions, Snapshot.from_resources(translated))
            self._native[node_class] = native
        resources = {type_url: snapshot.resources(type_url) for type_url in snapshot.type_urls()}
        for type_url in NATIVE_TYPES:
            resources[type_url] = native[1].resources(type_url)
        # The default's filter configurations stay beside the class's: a delta stream
        # removes what a snapshot lacks, and connections draining from a listener of the
        # other kind (a reload of the setting, a fallback) still name the Lua reader's.
        resources[EXTENSION_CONFIG] = {
            **snapshot.resources(EXTENSION_CONFIG),
            **native[1].resources(EXTENSION_CONFIG),
        }
        return Snapshot(resources)

    def nacked(self, node_id: str, node_class: str, type_url: str, message: str) -> None:
        if type_url not in NATIVE_TYPES or self._setting != NATIVE_NODE:
            return
        # Envoy 1.40: "Failed to load dynamic module: <path> : <dlopen's words>", or, for a
        # library that refuses a filter's configuration (one built from other sources than
        # the control plane's, which knows other filters or settings), "Failed to
        # initialize dynamic module". Any other reason would fail without the library alike.
        if not any(words in message.lower() for words in REFUSED_WORDS):
            return
        self._refuse((node_id, node_class), message)
        log.warning(
            "node %r cannot load the native filters library its bootstrap names (%r): "
            "Envoy's own filters for it until it reconnects. Envoy said: %r",
            node_id, node_class, message,
        )  # fmt: skip
        self._cache.reclassify(node_id, None)

    def refused_status(self) -> list[dict[str, str]]:
        """For /status: the libraries Envoys could not load (node, path, Envoy's words)."""
        return [{"node_id": node, "path": path, "message": message}
                for (node, path), message in sorted(self.refused.items())]  # fmt: skip
