"""The current snapshot(s) and the streams waiting for them to change.

One snapshot serves every node; a node id may have its own override. Setting
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
from typing import Protocol

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


class SnapshotCache:
    """Holds snapshots and the status of connected nodes."""

    def __init__(self) -> None:
        self._default: Snapshot | None = None
        self._overrides: dict[str, Snapshot] = {}
        self._watchers: dict[str, set[Watcher]] = {}
        self._check = ConsistencyCheck()
        #: Content version of the last snapshot found consistent (checked once).
        self._consistent_version: str | None = None
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

        Rule 14: an inconsistent snapshot is logged and refused with
        `InconsistentSnapshot`; what was published before stays.
        Rule 7: streams are woken only when their snapshot's content changed,
        and each then sends only what differs from what its client has.
        """
        self._refuse_if_inconsistent(snapshot, node_id)
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

    def missing_references(self, snapshot: Snapshot) -> list[MissingReference]:
        """Rule 14 without publishing: what `snapshot` lacks (empty if consistent).

        For a caller that must refuse a config before it changes its own state;
        `set_snapshot` then does not walk the same content again.
        """
        if snapshot.version() == self._consistent_version:
            return []
        missing = self._check.missing(snapshot)
        if not missing:
            self._consistent_version = snapshot.version()
        return missing

    def _refuse_if_inconsistent(self, snapshot: Snapshot, node_id: str | None) -> None:
        current = self.get_snapshot(node_id)
        if current is not None and current.version() == snapshot.version():
            return  # same content as one already checked
        missing = self.missing_references(snapshot)
        if missing:
            error = InconsistentSnapshot(missing)
            log.error("%s%s; the previous snapshot keeps serving",
                      error, "" if node_id is None else f" (node {node_id!r})")  # fmt: skip
            raise error

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
