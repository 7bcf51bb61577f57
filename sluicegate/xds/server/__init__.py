"""The ADS server room: snapshots, the cache that pushes them and the gRPC
servicer (SotW and delta). Resource types live in `sluicegate.xds.resource`;
the ADS client that tests and benchmarks use, in `sluicegate.testing.ads_client`.

Decisions (the rule numbers are those of docs/xds-rules.md):

- Rule 2: a request without type_url ends the stream with INVALID_ARGUMENT.
- Rule 3: a response's version is a hash of the names and per-resource
  content hashes the client will hold for that type after applying it; when
  the client holds the whole type it equals `Snapshot.version(type_url)`. So
  versions survive restarts, and a reconnecting SotW client whose version
  matches is not sent anything again (delta: `initial_resource_versions`).
- Rule 5: a NACKed version is never sent again on that stream until the
  snapshot's version of that type changes. A NACK, or a step that would
  resend a NACKed version, holds the rest of that push (make before break).
- Rule 6: a SotW request with a stale nonce still counts as ACK/NACK for
  `status()`, but changes nothing else and gets no answer.
- Rule 9: a new wildcard subscription is answered even when it has nothing to
  send (delta too), since Envoy starts its listeners only after its first CDS answer.
- Rule 12: a push runs in steps, each waiting for the client's answers (or
  `ack_timeout`): secrets; filter configs (ECDS); clusters with endpoints;
  listeners; routes; then removals. SotW CDS first carries old and new
  clusters, the final CDS goes out last. Clusters that changed get their
  endpoints resent even if those did not change: Envoy keeps a changed
  cluster warming (and its CDS ACK back) until it has them.
- Rule 14: `SnapshotCache.set_snapshot` refuses (raises `InconsistentSnapshot`)
  a snapshot lacking a resource another in it names over ADS; the last good
  snapshot keeps serving.
"""

from sluicegate.xds.resource import (
    CLUSTER,
    ENDPOINT,
    EXTENSION_CONFIG,
    FULL_STATE_TYPES,
    LISTENER,
    PUSH_ORDER,
    ROUTE,
    SECRET,
)
from sluicegate.xds.server.cache import NodeClasses, SnapshotCache
from sluicegate.xds.server.consistency import (
    InconsistentSnapshot,
    MissingReference,
    missing_references,
)
from sluicegate.xds.server.server import AdsServicer, bound_port, serve_ads
from sluicegate.xds.server.snapshot import ResourceEntry, Snapshot
from sluicegate.xds.server.status import AdsStatus, NackRecord, NodeStatus, TypeStatus

# The type URLs live in sluicegate.xds.resource; they are re-exported here for callers
# that import them with the server.
__all__ = [
    "CLUSTER",
    "ENDPOINT",
    "EXTENSION_CONFIG",
    "FULL_STATE_TYPES",
    "LISTENER",
    "PUSH_ORDER",
    "ROUTE",
    "SECRET",
    "AdsServicer",
    "AdsStatus",
    "InconsistentSnapshot",
    "MissingReference",
    "NackRecord",
    "NodeClasses",
    "NodeStatus",
    "ResourceEntry",
    "Snapshot",
    "SnapshotCache",
    "TypeStatus",
    "bound_port",
    "missing_references",
    "serve_ads",
]
