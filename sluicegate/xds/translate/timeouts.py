"""Tiered timeouts: where each of `timeouts.*` lands in Envoy (checked on Envoy 1.40).

- `connect`    -> Cluster.connect_timeout: TCP connect plus TLS handshake.
- `first_byte` -> RetryPolicy.per_try_timeout: per attempt, until response headers are
  forwarded to the client; never after, so it cannot cut a stream.
- `first_token` -> the same per_try_timeout, on the route's stream twin (streams.py), which
  only streamed requests match: a stream's headers come with its first token, a
  non-streamed answer's only when it is complete, so one timer cannot serve both.
- `idle`       -> RetryPolicy.per_try_idle_timeout: per attempt, any silence from the
  provider, the wait for the first byte included; restarts on every byte.
- `total`      -> RouteAction.timeout: the whole request, retries included; it cuts a
  stream that is still producing.

Measured with a real Envoy against the mock provider (tests/resilience/test_timeouts.py
keeps the proof): a 3 s stream with per_try_timeout 1 s completes; per_try_timeout fires
only before headers (504, details `upstream_per_try_timeout`, retried under `reset`);
per_try_idle_timeout fires before headers (504, `upstream_per_try_idle_timeout`) and
mid-stream (the stream is reset); RouteAction.timeout cuts a running stream
(`response_timeout`). Envoy's RouteAction.timeout default is 15 s, so it is always set
explicitly (`total`, 0 = none).

The HTTP connection manager's stream idle timeout (5 min, listeners.py) would also fire on
a silent upstream, but it cannot be retried and has no per-route value; a route with a
per-attempt `idle` turns it off (RouteAction.idle_timeout 0), so its own timer, which is
retried and reported as `upstream_idle_timeout`, always decides.
"""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2 as rc
from google.protobuf import duration_pb2

from sluicegate.model import Route

from ._proto import duration_ms


def connect_timeout(route: Route) -> duration_pb2.Duration:
    return duration_ms(route.settings.timeouts.connect)


def apply_route_timeouts(action: rc.RouteAction, route: Route) -> None:
    """The route-level timers; the per-attempt ones are part of the retry policy."""
    timeouts = route.settings.timeouts
    action.timeout.CopyFrom(duration_ms(timeouts.total))
    if timeouts.idle:
        action.idle_timeout.CopyFrom(duration_ms(0))


def until_headers_ms(route: Route, *, streamed: bool) -> int:
    """The per-attempt wait for the response headers (0: none): `first_token` for a
    streamed request (`stream_first_token`: 15 s or `first_byte` when unset), `first_byte`
    otherwise."""
    timeouts = route.settings.timeouts
    return timeouts.stream_first_token if streamed else timeouts.first_byte


def apply_attempt_timeouts(policy: rc.RetryPolicy, route: Route, *, streamed: bool) -> None:
    timeouts = route.settings.timeouts
    until_headers = until_headers_ms(route, streamed=streamed)
    if until_headers:
        policy.per_try_timeout.CopyFrom(duration_ms(until_headers))
    if timeouts.idle:
        policy.per_try_idle_timeout.CopyFrom(duration_ms(timeouts.idle))
