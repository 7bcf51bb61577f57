"""The route's RetryPolicy: conditions, attempts, back-off, Retry-After, other providers.

- `retry_on` words map to Envoy's `connect-failure`, `reset`, `refused-stream`; statuses to
  `retriable-status-codes` with `retriable_status_codes`. Envoy retries an attempt that hit
  per_try_timeout / per_try_idle_timeout under `reset` (also under `5xx` and
  `gateway-error`, which are not used: they would retry 500s).
- `num_retries` is always written: Envoy's default is 1.
- retry_back_off: exponential, fully jittered: retry N waits random [0, (2^N - 1) * base),
  at most max.
- rate_limited_retry_back_off: when the answer being retried carries `Retry-After: N`
  (seconds) and N <= retry_after_max, Envoy waits random [N, 1.5 N) instead.
- previous_hosts (with host_selection_retry_max_attempts) makes each retry pick a provider
  not yet tried for this request; previous_priorities moves retries to the next priority
  level once the first level's providers were tried. A route of one provider retries on it.
- Envoy never retries once response bytes went to the client: a stream cut mid-way ends
  for the client (tests/resilience prove it with the mock's `cut` fault).
- The retry budget lives in the cluster's circuit breakers (circuit_breakers.py).
"""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.extensions.retry.priority.previous_priorities.v3 import (
    previous_priorities_config_pb2,
)
from google.protobuf import wrappers_pb2

from sluicegate.model import Route

from ._proto import duration_ms, pack
from .timeouts import apply_attempt_timeouts, until_headers_ms

PREVIOUS_HOSTS = "envoy.retry_host_predicates.previous_hosts"
PREVIOUS_PRIORITIES = "envoy.retry_priorities.previous_priorities"
RETRY_AFTER = "retry-after"
# Host picks per retry before Envoy settles for an already tried provider.
MIN_HOST_SELECTION_ATTEMPTS = 5


def retry_policy(route: Route, *, streamed: bool = False) -> rc.RetryPolicy | None:
    """None when the route neither retries nor has per-attempt timeouts. `streamed`: the
    policy of the route's stream twin (streams.py), whose attempts wait `first_token`."""
    retries = route.settings.retries
    timeouts = route.settings.timeouts
    if (
        not retries.max_retries
        and not until_headers_ms(route, streamed=streamed)
        and not timeouts.idle
    ):
        return None
    words = [c for c in retries.retry_on if isinstance(c, str)]
    statuses = sorted(c for c in retries.retry_on if isinstance(c, int))
    if statuses:
        words.append("retriable-status-codes")
    policy = rc.RetryPolicy(
        retry_on=",".join(words),
        num_retries=wrappers_pb2.UInt32Value(value=retries.max_retries),
        retriable_status_codes=statuses,
    )
    apply_attempt_timeouts(policy, route, streamed=streamed)
    if not retries.max_retries:
        return policy
    policy.retry_back_off.CopyFrom(
        rc.RetryPolicy.RetryBackOff(
            base_interval=duration_ms(retries.backoff.base),
            max_interval=duration_ms(retries.backoff.max),
        )
    )
    if retries.retry_after_max:
        policy.rate_limited_retry_back_off.CopyFrom(
            rc.RetryPolicy.RateLimitedRetryBackOff(
                reset_headers=[
                    rc.RetryPolicy.ResetHeader(name=RETRY_AFTER, format=rc.RetryPolicy.SECONDS)
                ],
                max_interval=duration_ms(retries.retry_after_max),
            )
        )
    if retries.other_provider and len(route.backends) > 1:
        policy.retry_host_predicate.append(
            rc.RetryPolicy.RetryHostPredicate(
                name=PREVIOUS_HOSTS, typed_config=pack(previous_hosts_pb2.PreviousHostsPredicate())
            )
        )
        policy.host_selection_retry_max_attempts = max(
            MIN_HOST_SELECTION_ATTEMPTS, 2 * len(route.backends)
        )
    if retries.other_provider and route.priority_levels > 1:
        policy.retry_priority.CopyFrom(
            rc.RetryPolicy.RetryPriority(
                name=PREVIOUS_PRIORITIES,
                typed_config=pack(
                    previous_priorities_config_pb2.PreviousPrioritiesConfig(
                        update_frequency=route.first_level_size
                    )
                ),
            )
        )
    return policy
