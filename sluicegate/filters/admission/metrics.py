"""Prometheus metrics of admission: decisions, queues, tokens, and the limiter store.

Names follow Prometheus base units (`_seconds`, `_total`). Labels name tenants, models,
routes and priority classes, never a key. Gauges of queue depth and slots in flight are
read from the gates at scrape time, so the hot path only increments counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..queueing import PriorityGate

# Queue waits run from nothing to a class's max_wait (seconds to minutes).
_QUEUE_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# One Redis round trip: sub-millisecond to the configured timeout.
_STORE_BUCKETS: Final = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class _GateCollector(Collector):
    def __init__(self, gates: Callable[[], Mapping[str, PriorityGate]]) -> None:
        self._gates = gates

    def collect(self) -> Iterator[Any]:
        depth = GaugeMetricFamily(
            "sluicegate_queue_depth",
            "Requests waiting in a gate's queue",
            labels=["gate", "priority"],
        )
        in_flight = GaugeMetricFamily(
            "sluicegate_gate_in_flight_requests", "Requests holding a gate slot", labels=["gate"]
        )
        in_flight_tokens = GaugeMetricFamily(
            "sluicegate_gate_in_flight_tokens",
            "Estimated tokens of requests holding a gate slot",
            labels=["gate"],
        )
        for gate_name, gate in sorted(self._gates().items()):
            for item in gate.policy.classes:
                depth.add_metric([gate_name, item.name], gate.depth(item.name))
            in_flight.add_metric([gate_name], gate.in_flight)
            in_flight_tokens.add_metric([gate_name], gate.in_flight_tokens)
        yield depth
        yield in_flight
        yield in_flight_tokens


class AdmissionMetrics:
    """All admission metrics on one registry (served by sluicegate's /metrics)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "sluicegate_admission_decisions",
            "Admission decisions by outcome and priority class",
            ["outcome", "priority"],
            registry=r,
        )
        self.queue_time = Histogram(
            "sluicegate_queue_time_seconds",
            "Time a request waited at a gate (admitted or shed)",
            ["priority", "outcome"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.tokens_reserved = Counter(
            "sluicegate_tokens_reserved",
            "Tokens reserved at admission (estimate: prompt + max_tokens)",
            ["tenant", "model"],
            registry=r,
        )
        self.tokens_charged = Counter(
            "sluicegate_tokens_charged",
            "Tokens charged after the response (real usage, or the fallback count)",
            ["tenant", "model", "type"],
            registry=r,
        )
        self.tokens_refunded = Counter(
            "sluicegate_tokens_refunded",
            "Reserved tokens given back at reconcile (estimate minus real usage, when positive)",
            ["tenant", "model"],
            registry=r,
        )
        # Labelled by declared `auto` tenants only (charge.charge_fast_lane checks): bounded.
        self.fast_lane_charges = Counter(
            "sluicegate_fast_lane_charges",
            "Requests of auto tenants admitted by Envoy in the fast lane and charged into "
            "their exact-lane windows",
            ["tenant"],
            registry=r,
        )
        self.usage_source = Counter(
            "sluicegate_usage_reports",
            "Where a response's usage came from: provider usage, counted chunks, estimate",
            ["source"],
            registry=r,
        )
        self.store_latency = Histogram(
            "sluicegate_limiter_store_seconds",
            "Latency of limiter store calls",
            ["op"],
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self.store_failures = Counter(
            "sluicegate_limiter_store_failures",
            "Limiter store calls that failed (Redis unreachable, timeout, error)",
            ["op"],
            registry=r,
        )
        self.store_down = Counter(
            "sluicegate_limiter_store_state_changes",
            "Times the shared limiter store went down or came back",
            ["state"],
            registry=r,
        )

        self.dropped_charges = Counter(
            "sluicegate_limiter_dropped_charges",
            "Charge attempts for requests admitted elsewhere (an auto tenant's fast-lane "
            "requests) counted nowhere: Redis was down and on_failure is not local (a "
            "running request's records each try again)",
            registry=r,
        )

    def watch_gates(self, gates: Callable[[], Mapping[str, PriorityGate]]) -> None:
        self.registry.register(_GateCollector(gates))


class StoreMetrics:
    """Adapts AdmissionMetrics to the limiter's StoreObserver protocol."""

    def __init__(self, metrics: AdmissionMetrics) -> None:
        self._metrics = metrics

    def store_latency(self, op: str, seconds: float) -> None:
        self._metrics.store_latency.labels(op).observe(seconds)

    def store_failure(self, op: str) -> None:
        self._metrics.store_failures.labels(op).inc()

    def store_state(self, state: str) -> None:
        self._metrics.store_down.labels(state).inc()

    def charge_dropped(self) -> None:
        self._metrics.dropped_charges.inc()
