"""sluicegate.lanes: which lane each `auto` tenant's requests take (docs/fast-lane.md,
"The auto lane").

    steering = LaneSteering()                # in the control plane
    steering.load(gateway)                   # each config load: thresholds, auto tenants, limits
    steering.on_records(batch)               # usage notes (notes.py) the ext_proc servers
                                             # make of records and forward (forwarder.py)
    for move in steering.tick(): ...         # every tick_s: the tenants that change lanes
    gateway.with_lanes(steering.lanes())     # pushed: the key check alone

An auto tenant runs in the fast lane (Envoy's token buckets) while its usage is far from
its limits, and in the exact lane (the routing stage's sliding windows) near them.
`usage` (a sliding-window log per set of limits) is pure; `steering` holds the state,
with the clock passed in.
"""

from .forwarder import NoteForwarder
from .notes import UsageNote, note_body, note_of
from .steering import AutoLaneSettings, LaneMove, LaneSteering, LimitUsage, TenantLane
from .usage import SLOTS, Usage, UsageLog

__all__ = [
    "SLOTS",
    "AutoLaneSettings",
    "LaneMove",
    "LaneSteering",
    "LimitUsage",
    "NoteForwarder",
    "TenantLane",
    "Usage",
    "UsageLog",
    "UsageNote",
    "note_body",
    "note_of",
]
