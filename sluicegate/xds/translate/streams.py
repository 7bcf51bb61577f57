"""A model route's stream twin: the same route for streamed requests, waiting `first_token`.

Envoy has one per-attempt timer until the response headers (per_try_timeout), but a
stream's headers come with its first token (seconds) and a non-streamed answer's only when
it is complete (minutes): one value either leaves a hung provider too late for streams or
cuts long non-streamed answers. Only the routing stage knows a request streams (the body's
`"stream": true`); it says so in STREAM_HEADER when it sets the model header and clears
the route cache, and the re-match lands on the twin, placed before its plain route
(right before it, but for the fast lane's twins of the top class: envoy_routing.py).
The twin is the plain route plus that header match, with `first_token` as per_try_timeout
and the header removed before any attempt, so providers never see it.

Why a route and not Envoy's x-envoy-upstream-rq-per-try-timeout-ms set by the routing
stage: ext_proc may not write x-envoy-* headers unless its mutation rules allow every one
of them (allow_envoy), the value would be per route policy carried through Python, and a
twin keeps the timeout where every other timeout is: in the pushed route (docs/resilience.md,
"Streamed requests: first_token").
"""

from __future__ import annotations

from typing import Final

from envoy.config.route.v3 import route_components_pb2 as rc

from sluicegate import wire
from sluicegate.model import Route

from .retries import retry_policy

STREAM_HEADER: Final = wire.STREAM_HEADER


def stream_twin(plain: rc.Route, route: Route) -> rc.Route:
    """`plain` (a model route of `route`) for streamed requests only."""
    twin = rc.Route()
    twin.CopyFrom(plain)
    twin.match.headers.append(rc.HeaderMatcher(name=STREAM_HEADER, present_match=True))
    twin.request_headers_to_remove.append(STREAM_HEADER)
    twin.route.ClearField("retry_policy")
    policy = retry_policy(route, streamed=True)
    if policy is not None:
        twin.route.retry_policy.CopyFrom(policy)
    return twin


def with_stream_twin(plain: rc.Route, route: Route) -> list[rc.Route]:
    """The twin, then `plain`: first match wins, and only streams carry the header."""
    return [stream_twin(plain, route), plain]
