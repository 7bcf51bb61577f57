"""Who is connected and what they accepted or rejected (rule 5: record NACKs).

One `NodeStatus` per Envoy node id, kept by `AdsStatus`. Streams update it;
`SnapshotCache.status()` hands out copies for `sluicegate status` and metrics.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

StreamKind = Literal["sotw", "delta"]

#: Disconnected nodes kept for inspection; the oldest are forgotten first.
MAX_DISCONNECTED = 1024


@dataclass
class NackRecord:
    """Rule 4/5: what a node rejected. `version` is the version it rejected."""

    version: str
    message: str
    at: float
    nonce: str
    code: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "message": self.message,
            "at": self.at,
            "nonce": self.nonce,
            "code": self.code,
        }


@dataclass
class TypeStatus:
    """One resource type on one node."""

    acked_version: str | None = None
    acked_at: float | None = None
    sent_version: str | None = None
    sent_at: float | None = None
    #: The version of the node's view of its newest snapshot (the resources it subscribed
    #: to, rule 3): what it acks once every push reached it. Not the snapshot's version of
    #: the type, which covers resources the node never asked for (another Envoy's ECDS).
    serving_version: str | None = None
    last_nack: NackRecord | None = None
    nack_count: int = 0
    #: True while the latest answer for this type was a NACK.
    nacked: bool = False


@dataclass
class NodeStatus:
    """An Envoy node as the ADS server sees it."""

    node_id: str
    cluster: str = ""
    stream_kind: StreamKind = "sotw"
    connected_since: float | None = None
    disconnected_at: float | None = None
    streams: int = 0
    types: dict[str, TypeStatus] = field(default_factory=dict)
    #: The class the cache put it in (SnapshotCache.identify), or None.
    node_class: str | None = None

    @property
    def connected(self) -> bool:
        return self.streams > 0

    def copy(self) -> NodeStatus:
        """A copy that later updates do not touch (NackRecords are never mutated)."""
        types = {t: dataclasses.replace(s) for t, s in self.types.items()}
        return dataclasses.replace(self, types=types)

    def acked_versions(self) -> dict[str, str]:
        return {t: s.acked_version for t, s in self.types.items() if s.acked_version is not None}

    def current_nacks(self) -> dict[str, NackRecord]:
        """Types whose latest answer was a NACK: live errors."""
        return {
            t: s.last_nack for t, s in self.types.items() if s.nacked and s.last_nack is not None
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: `acked` (type → version), `serving` (type → the version of its
        view of the newest snapshot: TypeStatus.serving_version), `nacks` (live errors only),
        `last_nacks` (most recent NACK per type, even if a later ACK fixed it)."""
        return {
            "node_id": self.node_id,
            "cluster": self.cluster,
            "stream_kind": self.stream_kind,
            "connected": self.connected,
            "connected_since": self.connected_since,
            "disconnected_at": self.disconnected_at,
            "streams": self.streams,
            "class": self.node_class,
            "acked": self.acked_versions(),
            "sent": {t: s.sent_version for t, s in self.types.items() if s.sent_version},
            "serving": {t: s.serving_version for t, s in self.types.items() if s.serving_version},
            "nacks": {t: n.to_dict() for t, n in self.current_nacks().items()},
            "last_nacks": {
                t: {**s.last_nack.to_dict(), "count": s.nack_count}
                for t, s in self.types.items()
                if s.last_nack is not None
            },
        }


class AdsStatus:
    """Registry of NodeStatus by node id, plus NACK totals for metrics."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeStatus] = {}
        self._disconnected: OrderedDict[str, None] = OrderedDict()
        self.nacks_total: Counter[str] = Counter()

    def connect(self, node_id: str, cluster: str, kind: StreamKind) -> NodeStatus:
        """A stream for this node started (rule 1: called once, from its first request)."""
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = NodeStatus(node_id)
        self._disconnected.pop(node_id, None)
        if node.streams == 0:
            node.connected_since = time.time()
            node.disconnected_at = None
            # A new connection may be a new Envoy process (one `sluicegate up` restarted)
            # that holds nothing: what an earlier one acked, was sent or rejected is not
            # its state. A reconnecting Envoy that holds a version says so and has it
            # recorded again (rule 3); the NACK history stays.
            node.types = {
                type_url: TypeStatus(last_nack=old.last_nack, nack_count=old.nack_count)
                for type_url, old in node.types.items()
            }
        node.streams += 1
        node.cluster = cluster
        node.stream_kind = kind
        return node

    def set_class(self, node_id: str, node_class: str | None) -> None:
        """The node was put in another class (SnapshotCache.reclassify)."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.node_class = node_class

    def disconnect(self, node: NodeStatus) -> None:
        node.streams = max(0, node.streams - 1)
        if node.streams == 0:
            node.disconnected_at = time.time()
            self._disconnected[node.node_id] = None
            while len(self._disconnected) > MAX_DISCONNECTED:
                old, _ = self._disconnected.popitem(last=False)
                self._nodes.pop(old, None)

    @staticmethod
    def sent(node: NodeStatus, type_url: str, version: str) -> None:
        ts = node.types.setdefault(type_url, TypeStatus())
        ts.sent_version = version
        ts.sent_at = time.time()

    @staticmethod
    def serving(node: NodeStatus, type_url: str, version: str) -> None:
        node.types.setdefault(type_url, TypeStatus()).serving_version = version

    @staticmethod
    def acked(node: NodeStatus, type_url: str, version: str) -> None:
        ts = node.types.setdefault(type_url, TypeStatus())
        ts.acked_version = version
        ts.acked_at = time.time()
        ts.nacked = False

    def nacked(self, node: NodeStatus, type_url: str, record: NackRecord) -> None:
        ts = node.types.setdefault(type_url, TypeStatus())
        ts.last_nack = record
        ts.nack_count += 1
        ts.nacked = True
        self.nacks_total[type_url] += 1

    def nodes(self, include_disconnected: bool = False) -> list[NodeStatus]:
        """Copies, sorted by node id, so callers cannot disturb live state."""
        return [
            n.copy() for _, n in sorted(self._nodes.items()) if include_disconnected or n.connected
        ]
