"""The route cluster's circuit breakers: pool limits and the retry budget.

Envoy keeps these per cluster (= per route, all providers together), except
`per_host_thresholds.max_connections`, the only limit Envoy applies per host (= per
provider; a DNS provider resolving to several addresses gets it per address). A request
over a limit fails at once (503, response flag UO, code `upstream_overflow`), it does not
queue; `max_pending_requests` is the queue for a free connection and must be at least 1,
because every request waits there while its connection is being made.

The retry budget replaces Envoy's fixed max_retries threshold (3): retries in flight may
be at most `percent` of the requests in flight (pending included), but always
`min_concurrency`. A retry over budget is not made (stat upstream_rq_retry_overflow) and
the client gets the last answer.

A route's gate that Envoy enforces (model.EnvoyGate, docs/fast-lane.md "Gates in the fast
lane") sets the thresholds of Envoy's routing priorities: DEFAULT holds the gate (or the
lower classes' share of it) and HIGH the top class's share, each with its own connections,
requests and pending queue, which Envoy counts apart, route-wide (its connection pools
are per worker, provider and priority). On HTTP/1.1 a connection carries
one request, so a request over the connections waits in the pending queue (in arrival
order, per worker and provider: its connection pool's) and one
over the queue is refused at once (UO, `upstream_overflow`); on HTTP/2 `max_requests`
refuses at once.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import circuit_breaker_pb2
from envoy.config.core.v3 import base_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import wrappers_pb2

from sluicegate.model import Route

Thresholds = circuit_breaker_pb2.CircuitBreakers.Thresholds


def circuit_breakers(route: Route) -> circuit_breaker_pb2.CircuitBreakers:
    pool = route.settings.pool
    gate = route.envoy_gate
    breakers = circuit_breaker_pb2.CircuitBreakers(
        thresholds=[
            _thresholds(
                route, base_pb2.DEFAULT, None if gate is None else (gate.requests, gate.pending)
            ),
        ]
    )
    if gate is not None and gate.top_class is not None:
        top = (gate.top_requests, gate.top_pending)
        breakers.thresholds.append(_thresholds(route, base_pb2.HIGH, top))
    if pool.max_connections_per_provider:
        for thresholds in breakers.thresholds:
            breakers.per_host_thresholds.append(
                Thresholds(
                    priority=thresholds.priority,
                    max_connections=_u32(pool.max_connections_per_provider),
                )
            )
    return breakers


def _thresholds(
    route: Route, priority: base_pb2.RoutingPriority.ValueType, gate: tuple[int, int] | None
) -> circuit_breaker_pb2.CircuitBreakers.Thresholds:
    """One priority's limits: the pool's, or the gate's `(in flight, waiting)` share
    (model.EnvoyGate, which applied the pool's already)."""
    pool = route.settings.pool
    budget = route.settings.retries.budget
    connections, pending, requests = (
        pool.max_connections,
        pool.max_pending_requests,
        pool.max_requests,
    )
    if gate is not None:
        in_flight, pending = gate
        requests = in_flight
        # On HTTP/2 a connection carries many requests: the pool's connections stay.
        connections = in_flight if route.protocol == "http1" else min(connections, in_flight)
    return Thresholds(
        priority=priority,
        max_connections=_u32(connections),
        max_pending_requests=_u32(pending),
        max_requests=_u32(requests),
        retry_budget=Thresholds.RetryBudget(
            budget_percent=percent_pb2.Percent(value=budget.percent),
            min_retry_concurrency=_u32(budget.min_concurrency),
        ),
        # remaining_* gauges in /stats: how close the route is to each limit.
        track_remaining=True,
    )


def _u32(value: int) -> wrappers_pb2.UInt32Value:
    return wrappers_pb2.UInt32Value(value=value)
