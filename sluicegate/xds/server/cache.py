"""The current snapshot(s) and the streams waiting for them to change.

One snapshot serves every node; a node id may have its own override. Setting
a snapshot wakes only the streams it concerns, by a flag and one queue put
each: no polling, so thousands of idle streams cost nothing.
"""

from __future__ import annotations

from typing import Protocol

from sluicegate.xds.server.snapshot import Snapshot
from sluicegate.xds.server.status import AdsStatus, NodeStatus


class Watcher(Protocol):
    """A stream that wants to know when its node's snapshot changed."""

    def snapshot_changed(self) -> None: ...


class SnapshotCache:
    """Holds snapshots and the status of connected nodes."""

    def __init__(self) -> None:
        self._default: Snapshot | None = None
        self._overrides: dict[str, Snapshot] = {}
        self._watchers: dict[str, set[Watcher]] = {}
        self.ads_status = AdsStatus()

    def get_snapshot(self, node_id: str | None = None) -> Snapshot | None:
        """The snapshot a node gets: its override, else the default."""
        if node_id is not None:
            found = self._overrides.get(node_id)
            if found is not None:
                return found
        return self._default

    def set_snapshot(self, snapshot: Snapshot, node_id: str | None = None) -> None:
        """Publish a snapshot for every node (node_id None) or for one node.

        Rule 7: streams are woken only when their snapshot's content changed,
        and each then sends only what differs from what its client has.
        """
        if node_id is None:
            old = self._default
            self._default = snapshot
            if old is not None and old.version() == snapshot.version():
                return
            for node, watchers in self._watchers.items():
                if node not in self._overrides:
                    _wake(watchers)
        else:
            before = self.get_snapshot(node_id)
            self._overrides[node_id] = snapshot
            if before is None or before.version() != snapshot.version():
                _wake(self._watchers.get(node_id, ()))

    def clear_snapshot(self, node_id: str) -> None:
        """Drop a node's override; it falls back to the default snapshot."""
        old = self._overrides.pop(node_id, None)
        if old is not None and (self._default is None or old.version() != self._default.version()):
            _wake(self._watchers.get(node_id, ()))

    def watch(self, node_id: str, watcher: Watcher) -> None:
        self._watchers.setdefault(node_id, set()).add(watcher)

    def unwatch(self, node_id: str, watcher: Watcher) -> None:
        watchers = self._watchers.get(node_id)
        if watchers is not None:
            watchers.discard(watcher)
            if not watchers:
                del self._watchers[node_id]

    def stream_count(self) -> int:
        """Streams that have identified their node and wait for changes."""
        return sum(len(w) for w in self._watchers.values())

    def status(self, include_disconnected: bool = False) -> list[NodeStatus]:
        """Connected nodes (and, if asked, recently disconnected ones), as copies."""
        return self.ads_status.nodes(include_disconnected)


def _wake(watchers: set[Watcher] | tuple[()]) -> None:
    for watcher in list(watchers):
        watcher.snapshot_changed()
