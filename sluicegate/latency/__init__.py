"""sluicegate.latency: provider weights learned from latency and errors (`routing: latency`).

    router = LatencyRouter()                 # in the control plane
    router.load(gateway)                     # each config load: the configured weights
    server handler: records.logs_handler(router)   # Envoy's latency record log
    for change in router.tick(): ...         # once a second: what moved, to push over EDS
    gateway.with_weights(router.weights())

`smoothing` (a time-decayed mean), `tracker` (what a record says of its provider) and
`weighing` (shares from smoothed figures) are pure; `router` holds the state, with the
clock passed in. docs/latency-routing.md.
"""

from .router import WEIGHT_SCALE, LatencyRouter, ProviderWeight, WeightChange
from .smoothing import DecayingMean
from .tracker import (
    UPSTREAM_FAILURE_FLAGS,
    Observation,
    ProviderTracker,
    Smoothed,
    observe,
)
from .weighing import Weighing, distance, factors, floored, score_bounds, step, target_shares

__all__ = [
    "UPSTREAM_FAILURE_FLAGS",
    "WEIGHT_SCALE",
    "DecayingMean",
    "LatencyRouter",
    "Observation",
    "ProviderTracker",
    "ProviderWeight",
    "Smoothed",
    "Weighing",
    "WeightChange",
    "distance",
    "factors",
    "floored",
    "observe",
    "score_bounds",
    "step",
    "target_shares",
]
