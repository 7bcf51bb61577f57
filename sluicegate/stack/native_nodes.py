"""Each Envoy its own native filters library: the control plane's node classes.

With `native_filters.module: node` (the default), an Envoy whose bootstrap names the
path of sluicegate's native filters library on its machine (node metadata, written by
`sluicegate up` and `sluicegate bootstrap --native-module`) is served listeners that
load that library; an Envoy that names none gets Envoy's own filters
(docs/native-filters.md, "Turning it on"). The Envoys naming one path form a class of
the snapshot cache (xds.server.NodeClasses) with a snapshot of its own: the default
snapshot with its listeners translated again for that path (nothing else differs).

An Envoy that rejects (NACKs) its class's listeners for a reason that names the library
(it cannot load it) is moved to Envoy's own filters, and the pair (node, path) is
remembered as refused for as long as the control plane runs: so a wrong path costs one
NACK, never an Envoy without listeners. With any other setting every Envoy gets the
default snapshot, which names the library the setting names, or none.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from sluicegate.config import NATIVE_NODE
from sluicegate.envoy import declared_native_module
from sluicegate.model import Gateway
from sluicegate.xds.server import LISTENER, Snapshot, SnapshotCache
from sluicegate.xds.translate import translate_listeners

log = logging.getLogger("sluicegate.control_plane")


class NativeNodes:
    """The node classes of Envoys that name their native filters library (NodeClasses)."""

    def __init__(self, cache: SnapshotCache) -> None:
        self._cache = cache
        self._setting: str | None = None
        self._base: tuple[Snapshot, Gateway] | None = None
        # path -> (the default's listener version it was made from, its listeners)
        self._listeners: dict[str, tuple[str, Snapshot]] = {}
        # (node id, path) -> the NACK that made the node fall back to Envoy's filters
        self.refused: dict[tuple[str, str], str] = {}
        cache.sort_nodes_by(self)

    def publish(self, snapshot: Snapshot, model: Gateway, setting: str) -> None:
        """The default snapshot `snapshot` (of `model`) was published under `setting`
        (native_filters.module): publish every class's."""
        self._base = (snapshot, model)
        self._setting = setting
        for path in sorted(self._cache.node_classes()):
            made = self.snapshot_of(path)
            if made is not None:
                self._cache.set_class_snapshot(path, made)

    # ----- NodeClasses ---------------------------------------------------------------

    def class_of(self, node: Any) -> str | None:
        path = declared_native_module(node)
        if path is None or (node.id, path) in self.refused:
            return None
        return path

    def snapshot_of(self, node_class: str) -> Snapshot | None:
        if self._base is None:
            return None
        snapshot, model = self._base
        if self._setting != NATIVE_NODE:
            return snapshot
        listeners = self._listeners.get(node_class)
        if listeners is None or listeners[0] != snapshot.version(LISTENER):
            translated = translate_listeners(dataclasses.replace(model, native_module=node_class))
            made = Snapshot.from_resources({LISTENER: translated})
            listeners = (snapshot.version(LISTENER), made)
            self._listeners[node_class] = listeners
        resources = {type_url: snapshot.resources(type_url) for type_url in snapshot.type_urls()}
        return Snapshot({**resources, LISTENER: listeners[1].resources(LISTENER)})

    def nacked(self, node_id: str, node_class: str, type_url: str, message: str) -> None:
        if type_url != LISTENER or self._setting != NATIVE_NODE:
            return
        if node_class not in message and "dynamic module" not in message.lower():
            return  # not the library: the same listeners without it would fail alike
        self.refused[(node_id, node_class)] = message
        log.warning(
            "node %s cannot load the native filters library its bootstrap names (%s): "
            "Envoy's own filters for it from now on. Envoy said: %s",
            node_id, node_class, message,
        )  # fmt: skip
        self._cache.reclassify(node_id, None)

    def status(self) -> dict[str, Any]:
        """For /status: each connected Envoy's library, and the libraries refused."""
        nodes = {n.node_id: n.node_class for n in self._cache.status()}
        refused = [{"node_id": node, "path": path, "message": message}
                   for (node, path), message in sorted(self.refused.items())]  # fmt: skip
        return {"nodes": nodes, "refused": refused}
