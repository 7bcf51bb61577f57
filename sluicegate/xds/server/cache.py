"""The current snapshot(s) and the streams waiting for them to change.

One snapshot serves every node, but for two kinds of exception. A node *class*
has a snapshot of its own: the cache's `NodeClasses` (given by its owner, the control
plane) puts each node in a class, or in none, from what the node says of itself when
it connects (its `Node` message: id, cluster, metadata), and makes a class's snapshot
the first time a node of it connects. And a node id may have its own override. Setting
a snapshot wakes only the streams it concerns, by a flag and one queue put
each: no polling, so thousands of idle streams cost nothing.

Only consistent snapshots are published (docs/xds-rules.md, rule 14):
`set_snapshot` raises `InconsistentSnapshot` for one that lacks a resource
another in it names, and the previous snapshot keeps serving. It raises rather
than returns a flag so that no caller can publish a broken config unawares; a
caller that wants to know before changing its own state can call
`missing_references(snapshot)` first.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from sluicegate.xds.server.consistency import (
    ConsistencyCheck,
    InconsistentSnapshot,
    MissingReference,
)
from sluicegate.xds.server.snapshot import Snapshot
from sluicegate.xds.server.status import AdsStatus, NodeStatus

log = logging.getLogger("sluicegate.xds.server")


class Watcher(Protocol):
    """A stream that wants to know when its node's snapshot changed."""

    def snapshot_changed(self) -> None: ...


# Versions found consistent that are remembered (a default and a few classes' apart).
_CONSISTENT_KEPT = 64


class NodeClasses(Protocol):
    """Sorts nodes into classes served snapshots of their own; the cache asks it."""

    def class_of(self, node: Any, first: bool) -> str | None:
        """The class of a node (its `config.core.v3.Node`), or None for the default;
        `first`: no other stream of its node id is connected (a new process, maybe)."""
        ...

    def snapshot_of(self, node_class: str) -> Snapshot | None:
        """The snapshot a class's nodes get now (None: the default, as yet)."""
        ...

    def nacked(self, node_id: str, node_class: str, type_url: str, message: str) -> None:
        """A node of `node_class` rejected a `type_url` response with `message`."""
        ...


class SnapshotCache:
    """Holds snapshots and the status of connected nodes."""

    def __init__(self) -> None:
        self._default: Snapshot | None = None
        self._overrides: dict[str, Snapshot] = {}
        self._classes: NodeClasses | None = None
        self._class_snapshots: dict[str, Snapshot] = {}
        self._class_of: dict[str, str] = {}  # node id -> its class (none: the default)
        self._watchers: dict[str, set[Watcher]] = {}
        self._check = ConsistencyCheck()
        #: Content versions of snapshots found consistent (each checked once): the
        #: default's and each class's, which alternate.
        self._consistent: set[str] = set()
        self.ads_status = AdsStatus()

    def get_snapshot(self, node_id: str | None = None) -> Snapshot | None:
        """The snapshot a node gets: its override, else its class's, else the default."""
        if node_id is not None:
            found = self._overrides.get(node_id)
            if found is not None:
                return found
            node_class = self._class_of.get(node_id)
            if node_class is not None:
                found = self._class_snapshots.get(node_class)
                if found is not None:
                    return found
        return self._default

    def sort_nodes_by(self, classes: NodeClasses) -> None:
        """Put nodes that connect from now on in the classes `classes` gives them."""
        self._classes = classes

    def identify(self, node: Any) -> str | None:
        """A stream's node (its `Node` message) connected: put it in its class, making
        the class's snapshot if it is the class's first node, and return the class. A
        node id already connected whose new stream says otherwise moves, streams and all.
        """
        if self._classes is None:
            return None
        first = node.id not in self._watchers
        node_class = self._classes.class_of(node, first)
        if node_class is not None and node_class not in self._class_snapshots:
            try:
                made = self._classes.snapshot_of(node_class)
                if made is not None:
                    self._refuse_if_inconsistent(made, f" (class {node_class!r})")
                    self._class_snapshots[node_class] = made
            except Exception:  # the node is served the default instead
                log.exception("node %r: its class %r has no snapshot; it gets the default",
                              node.id, node_class)  # fmt: skip
                node_class = None
        self.reclassify(node.id, node_class)
        return node_class

    def node_classes(self) -> set[str]:
        """The classes of the nodes identified so far."""
        return set(self._class_of.values())

    def set_class_snapshot(self, node_class: str, snapshot: Snapshot) -> None:
        """Publish a class's snapshot (rules 7 and 14 as in `set_snapshot`)."""
        before = self._class_snapshots.get(node_class)
        self._refuse_if_inconsistent(snapshot, f" (class {node_class!r})")
        self._class_snapshots[node_class] = snapshot
        if before is None or before.version() != snapshot.version():
            for node, watchers in self._watchers.items():
                if self._class_of.get(node) == node_class and node not in self._overrides:
                    _wake(watchers)

    def reclassify(self, node_id: str, node_class: str | None, *, shown: bool = True) -> None:
        """Move a node to another class (None: the default), waking its streams if the
        snapshot it gets changes. A class left without nodes is forgotten: its snapshot
        is no longer published, so the next node of it must not be served a stale one.
        `shown`: note the class in the node's status (not for a node going away)."""
        before = self.get_snapshot(node_id)
        left = self._class_of.pop(node_id, None)
        if node_class is not None:
            self._class_of[node_id] = node_class
        if left is not None and left != node_class and left not in self._class_of.values():
            self._class_snapshots.pop(left, None)
        if shown:
            self.ads_status.set_class(node_id, node_class)
        after = self.get_snapshot(node_id)
        if after is not None and (before is None or before.version() != after.version()):
            _wake(self._watchers.get(node_id, ()))

    def nacked(self, node_id: str, type_url: str, message: str) -> None:
        """A node rejected a response: its class's sorter hears of it."""
        node_class = self._class_of.get(node_id)
        if node_class is not None and self._classes is not None:
            self._classes.nacked(node_id, node_class, type_url, message)

    def set_snapshot(self, snapshot: Snapshot, node_id: str | None = None) -> None:
        """Publish a snapshot for every node (node_id None) or for one node.

        Rule 14: an inconsistent snapshot is logged and refused with
        `InconsistentSnapshot`; what was published before stays.
        Rule 7: streams are woken only when their snapshot's content changed,
        and each then sends only what differs from what its client has.
        """
        self._refuse_if_inconsistent(snapshot, "" if node_id is None else f" (node {node_id!r})")
        if node_id is None:
            old = self._default
            self._default = snapshot
            if old is not None and old.version() == snapshot.version():
                return
            for node, watchers in self._watchers.items():
                if node not in self._overrides and self._own_class(node) is None:
                    _wake(watchers)
        else:
            before = self.get_snapshot(node_id)
            self._overrides[node_id] = snapshot
            if before is None or before.version() != snapshot.version():
                _wake(self._watchers.get(node_id, ()))

    def _own_class(self, node_id: str) -> str | None:
        """The node's class, if that class has a snapshot of its own."""
        node_class = self._class_of.get(node_id)
        return node_class if node_class in self._class_snapshots else None

    def missing_references(self, snapshot: Snapshot) -> list[MissingReference]:
        """Rule 14 without publishing: what `snapshot` lacks (empty if consistent).

        For a caller that must refuse a config before it changes its own state;
        `set_snapshot` then does not walk the same content again.
        """
        if snapshot.version() in self._consistent:
            return []
        missing = self._check.missing(snapshot)
        if not missing:
            if len(self._consistent) >= _CONSISTENT_KEPT:
                self._consistent.clear()
            self._consistent.add(snapshot.version())
        return missing

    def _refuse_if_inconsistent(self, snapshot: Snapshot, whose: str = "") -> None:
        """Rule 14: log and raise InconsistentSnapshot if `snapshot` lacks a resource it
        names. A version found consistent once is not walked again (missing_references
        remembers it), so republishing what serves costs nothing."""
        missing = self.missing_references(snapshot)
        if missing:
            error = InconsistentSnapshot(missing)
            log.error("%s%s; the previous snapshot keeps serving", error, whose)
            raise error

    def clear_snapshot(self, node_id: str) -> None:
        """Drop a node's override; it falls back to its class's snapshot or the default."""
        old = self._overrides.pop(node_id, None)
        new = self.get_snapshot(node_id)
        if old is not None and (new is None or old.version() != new.version()):
            _wake(self._watchers.get(node_id, ()))

    def watch(self, node_id: str, watcher: Watcher) -> None:
        self._watchers.setdefault(node_id, set()).add(watcher)

    def unwatch(self, node_id: str, watcher: Watcher) -> None:
        watchers = self._watchers.get(node_id)
        if watchers is not None:
            watchers.discard(watcher)
            if not watchers:
                del self._watchers[node_id]
                # A node that comes back is sorted again; a class no node is in is gone.
                self.reclassify(node_id, None, shown=False)

    def stream_count(self) -> int:
        """Streams that have identified their node and wait for changes."""
        return sum(len(w) for w in self._watchers.values())

    def status(self, include_disconnected: bool = False) -> list[NodeStatus]:
        """Connected nodes (and, if asked, recently disconnected ones), as copies."""
        return self.ads_status.nodes(include_disconnected)


def _wake(watchers: set[Watcher] | tuple[()]) -> None:
    for watcher in list(watchers):
        watcher.snapshot_changed()
