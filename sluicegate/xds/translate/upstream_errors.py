"""Distinct OpenAI-style errors for each way a provider attempt can fail inside Envoy.

Envoy answers these itself (local replies); the listener's local_reply_config
(listeners.py) rewrites each into `{"error": {"message", "type", "param", "code"}}` with the
`code` below, chosen by the reply's response code details (what Envoy's access logs show
as %RESPONSE_CODE_DETAILS%) or its response flags. Checked on Envoy 1.40 (see the
experiments summarised in timeouts.py and tests/resilience):

| Envoy's reply                                   | status | code                       |
|-------------------------------------------------|--------|----------------------------|
| details `ext_proc_error_gRPC_error_14{…}`, or a  | 503    | `ext_proc_unavailable`     |
| reset of the ext_proc stream (no server reached) |        |                            |
| details `upstream_per_try_timeout`              | 504    | `upstream_timeout`         |
| details `upstream_per_try_idle_timeout`         | 504    | `upstream_idle_timeout`    |
| details `response_timeout` (route timeout)      | 504    | `deadline_exceeded`        |
| details `stream_idle_timeout` (listener's 5 min)| 504    | `stream_idle_timeout`      |
| details `…{connection_timeout}` (flag UF)       | 503    | `upstream_connect_timeout` |
| flag UO (a pool limit)                          | 503    | `upstream_overflow`        |
| flag UH (every provider ejected or unhealthy)   | 503    | `no_healthy_upstream`      |
| flag UF (refused, TLS failure)                  | 503    | `upstream_connect_error`   |
| flags UC, UR (dropped before answering)         | 503    | `upstream_reset`           |

Retries exhausted on a provider's own answer (429, 503 …) are not local replies: the
client gets the last provider answer unchanged (its OpenAI error and Retry-After).
Once a response has started nothing can be rewritten: Envoy resets the stream (see the
docs/resilience.md, "What the client sees when a started stream fails").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UpstreamError:
    """One local-reply mapper: match on `details` (a CEL condition on
    response.code_details) or on Envoy response `flags`, answer `status` with `code`."""

    code: str
    status: int
    message: str
    details: str | None = None
    flags: tuple[str, ...] = ()
    retry_after_s: int | None = None  # adds a Retry-After header


def details_is(value: str) -> str:
    return f"response.code_details == '{value}'"


UPSTREAM_ERRORS: tuple[UpstreamError, ...] = (
    # No ext_proc server reachable (14 = UNAVAILABLE), or the one serving the request died
    # mid-stream: a fault of the gateway's own, but one a retry soon fixes (up restarts
    # the server; Envoy's health check moves traffic off it), so 503 with Retry-After.
    UpstreamError(
        "ext_proc_unavailable",
        503,
        "The gateway cannot process requests right now (no ext_proc server reachable); "
        "try again shortly",
        details="response.code_details.startsWith('ext_proc_error_gRPC_error_14{') || "
        "(response.code_details.startsWith('ext_proc_error_gRPC_error_') && "
        "response.code_details.contains('{upstream_reset'))",
        retry_after_s=1,
    ),
    UpstreamError(
        "upstream_timeout",
        504,
        "The provider did not start answering within the first-byte timeout "
        "(timeouts.first_byte, or timeouts.first_token for a streamed request), on every "
        "attempt",
        details=details_is("upstream_per_try_timeout"),
    ),
    UpstreamError(
        "upstream_idle_timeout",
        504,
        "The provider sent nothing for longer than the idle timeout (timeouts.idle), "
        "on every attempt",
        details=details_is("upstream_per_try_idle_timeout"),
    ),
    UpstreamError(
        "deadline_exceeded",
        504,
        "The request did not complete within the route's total timeout (timeouts.total)",
        details=details_is("response_timeout"),
    ),
    UpstreamError(
        "stream_idle_timeout",
        504,
        "Nothing was sent or received on this request for too long",
        details=details_is("stream_idle_timeout"),
    ),
    UpstreamError(
        "upstream_connect_timeout",
        503,
        "Could not connect to the provider within the connect timeout (timeouts.connect)",
        details="response.code_details.contains('{connection_timeout')",
    ),
    UpstreamError(
        "upstream_overflow",
        503,
        "Too many requests in flight to this model's providers (a pool limit); try again shortly",
        flags=("UO",),
        retry_after_s=1,
    ),
    UpstreamError(
        "no_healthy_upstream",
        503,
        "No healthy provider is available for this model right now",
        flags=("UH",),
    ),
    UpstreamError(
        "upstream_connect_error",
        503,
        "Could not connect to the provider",
        flags=("UF",),
    ),
    UpstreamError(
        "upstream_reset",
        503,
        "The provider closed the connection before answering",
        flags=("UC", "UR"),
    ),
)
