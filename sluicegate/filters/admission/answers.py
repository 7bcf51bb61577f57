"""What the admission stage tells a client: OpenAI-style errors and x-ratelimit-* values.

OpenAI's conventions (docs/architecture.md, "Errors the gateway makes"): 401 for a
missing or wrong key, 429 with `Retry-After` (seconds) and
`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (resets written like `6m0s`),
error `type` "requests" or "tokens" on a rate limit. A
request that could never fit a limit carries `x-should-retry: false`, which the official
SDKs obey, so they do not retry it in a loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from sluicegate import wire

from ..errors import shown_model
from ..limiter import Decision, LimitState
from ..queueing import Shed
from ..responses import immediate_error

MISSING_KEY: Final = immediate_error(
    401,
    "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
    code="missing_api_key",
    headers=(("www-authenticate", "Bearer"),),
)
INVALID_KEY: Final = immediate_error(
    401,
    "Incorrect API key provided. Ask the gateway's operator for a valid key.",
    code="invalid_api_key",
    headers=(("www-authenticate", "Bearer"),),
)
STORE_UNAVAILABLE: Final = immediate_error(
    503,
    "The gateway's rate limiter is unavailable and it is set to refuse requests then. "
    "Please retry shortly.",
    type="server_error",
    code="rate_limiter_unavailable",
    headers=(("retry-after", "1"), (wire.REFUSAL_HEADER, "rate_limiter_unavailable")),
)


def openai_duration(seconds: float) -> str:
    """1.5 -> "1.5s", 360 -> "6m0s", 0.02 -> "20ms" (the x-ratelimit-reset-* form)."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    tenths = math.ceil(seconds * 10)
    hours, rest = divmod(tenths, 36_000)
    minutes, rest = divmod(rest, 600)
    text = f"{rest // 10}" if rest % 10 == 0 else f"{rest / 10:.1f}"
    if hours:
        return f"{hours}h{minutes}m{text}s"
    if minutes:
        return f"{minutes}m{text}s"
    return f"{text}s"


def retry_after_seconds(seconds: float) -> str:
    """Whole seconds, rounded up, at least 1 (Retry-After takes integers)."""
    return str(max(1, math.ceil(seconds)))


def _tightest(states: Sequence[LimitState], tokens: bool) -> LimitState | None:
    chosen = [s for s in states if (s.limit.kind != "requests") == tokens]
    return min(chosen, key=lambda s: (s.remaining, -s.reset_s), default=None)


# wire.RATELIMIT_HEADERS lists (header, metadata key) for limit, remaining and reset of
# requests, then of tokens; the values below follow that order.
_NAMES: Final = {False: wire.RATELIMIT_HEADERS[:3], True: wire.RATELIMIT_HEADERS[3:]}


def ratelimit_values(states: Sequence[LimitState]) -> list[tuple[str, str, str]]:
    """(header, metadata key, value) for requests and tokens, each from the limit with the
    least room left, named as in wire.RATELIMIT_HEADERS."""
    values: list[tuple[str, str, str]] = []
    for tokens in (False, True):
        state = _tightest(states, tokens)
        if state is None:
            continue
        figures = (str(state.limit.limit), str(state.remaining), openai_duration(state.reset_s))
        values += [
            (header, key, value)
            for (header, key), value in zip(_NAMES[tokens], figures, strict=True)
        ]
    return values


def ratelimit_headers(states: Sequence[LimitState]) -> list[tuple[str, str]]:
    return [(header, value) for header, _, value in ratelimit_values(states)]


def _per(window_s: float) -> str:
    return "min" if window_s == 60 else openai_duration(window_s)


def refused(decision: Decision) -> bytes:
    """429 for a reservation a limit refused (or 503 when the store refuses all)."""
    limit = decision.refused_by
    if limit is None:
        return STORE_UNAVAILABLE
    unit = "requests" if limit.kind == "requests" else "tokens"
    kind = limit.kind.replace("_", " ")
    headers = ratelimit_headers(decision.states)
    state = next((s for s in decision.states if s.limit == limit), None)
    used = "" if state is None else f", used {state.used}"
    where = f"{limit.scope} {limit.name} on {kind} per {_per(limit.window_s)}"
    if decision.too_large or decision.retry_after_s is None:
        return immediate_error(
            429,
            f"Request too large for {where}: limit {limit.limit}, requested "
            f"{decision.requested}. Reduce the prompt or max_tokens; retrying cannot help.",
            type=unit,
            code="request_too_large",
            headers=[
                *headers,
                ("x-should-retry", "false"),
                (wire.REFUSAL_HEADER, "request_too_large"),
            ],
        )
    wait = decision.retry_after_s
    return immediate_error(
        429,
        f"Rate limit reached for {where}: limit {limit.limit}{used}, requested "
        f"{decision.requested}. Please try again in {openai_duration(wait)}.",
        type=unit,
        code="rate_limit_exceeded",
        headers=[
            *headers,
            ("retry-after", retry_after_seconds(wait)),
            (wire.REFUSAL_HEADER, "rate_limit_exceeded"),
        ],
    )


def shed(error: Shed) -> bytes:
    """503 for a request the priority queue let go, saying why."""
    code = f"queue_{error.reason}" if not error.reason.startswith("queue") else error.reason
    return immediate_error(
        503,
        f"The gateway is at capacity: {error.message}. Please retry in {error.retry_after_s}s.",
        type="server_error",
        code=code,
        headers=(("retry-after", str(error.retry_after_s)), (wire.REFUSAL_HEADER, code)),
    )


def model_forbidden(tenant: str, model: str) -> bytes:
    shown = shown_model(model)
    return immediate_error(
        403,
        f"Your key (tenant {tenant}) may not use the model `{shown}`.",
        param="model",
        code="model_not_allowed",
    )


def bad_priority(value: str, allowed: Sequence[str]) -> bytes:
    shown = value if len(value) <= 40 else value[:40] + "…"
    return immediate_error(
        400,
        f"Header x-sluicegate-priority is {shown!r}; your key may use: {', '.join(allowed)}.",
        param="x-sluicegate-priority",
        code="invalid_priority",
    )
