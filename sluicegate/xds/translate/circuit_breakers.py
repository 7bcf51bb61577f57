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
    budget = route.settings.retries.budget

    def u32(value: int) -> wrappers_pb2.UInt32Value:
        return wrappers_pb2.UInt32Value(value=value)

    breakers = circuit_breaker_pb2.CircuitBreakers(
        thresholds=[
            Thresholds(
                priority=base_pb2.DEFAULT,
                max_connections=u32(pool.max_connections),
                max_pending_requests=u32(pool.max_pending_requests),
                max_requests=u32(pool.max_requests),
                retry_budget=Thresholds.RetryBudget(
                    budget_percent=percent_pb2.Percent(value=budget.percent),
                    min_retry_concurrency=u32(budget.min_concurrency),
                ),
                # remaining_* gauges in /stats: how close the route is to each limit.
                track_remaining=True,
            )
        ]
    )
    if pool.max_connections_per_provider:
        breakers.per_host_thresholds.append(
            Thresholds(
                priority=base_pb2.DEFAULT, max_connections=u32(pool.max_connections_per_provider)
            )
        )
    return breakers
