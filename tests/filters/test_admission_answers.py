"""What admission tells a client: OpenAI-style errors, Retry-After and x-ratelimit-* values."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate import wire
from sluicegate.filters.admission import answers
from sluicegate.filters.limiter import Decision, Kind, Limit, LimitState
from sluicegate.filters.queueing import SHED_REASONS, Shed, ShedReason

from .admission_helpers import decode, immediate
from .helpers import error_of


def error(answer: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, error, headers), after checking the OpenAI error shape."""
    message = decode(answer)
    error_of(message)  # asserts the shape and the JSON content type
    return immediate(message)


# ----- durations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.02, "20ms"),
        (0.0201, "21ms"),  # rounded up, never down
        (0.0001, "1ms"),
        (0.999, "999ms"),
        (0, "0ms"),
        (-3, "0ms"),
        (1, "1s"),
        (1.0, "1s"),
        (1.01, "1.1s"),
        (1.5, "1.5s"),
        (59.9, "59.9s"),
        (59.95, "1m0s"),
        (60, "1m0s"),
        (61, "1m1s"),
        (90.5, "1m30.5s"),
        (360, "6m0s"),
        (3600, "1h0m0s"),
        (3725, "1h2m5s"),
        (86400, "24h0m0s"),
    ],
)
def test_openai_duration(seconds: float, text: str) -> None:
    assert answers.openai_duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "1"), (0.001, "1"), (0.2, "1"), (1, "1"), (1.01, "2"), (12.5, "13"), (60, "60")],
)
def test_retry_after_is_whole_seconds_rounded_up_at_least_one(seconds: float, text: str) -> None:
    assert answers.retry_after_seconds(seconds) == text


# ----- x-ratelimit-* values --------------------------------------------------------------


def state(kind: Kind, limit: int, remaining: int, reset_s: float, name: str = "t") -> LimitState:
    return LimitState(
        limit=Limit("tenant", name, kind, limit, 60.0),
        used=limit - remaining,
        remaining=remaining,
        reset_s=reset_s,
    )


def test_ratelimit_values_pick_the_tightest_of_each_unit() -> None:
    states = [
        state("requests", 100, 40, 5.0, "loose"),
        state("requests", 10, 3, 20.0, "tight"),
        state("tokens", 10_000, 9_000, 1.0),
        state("input_tokens", 5_000, 700, 2.5),  # an input limit is a token limit too
        state("output_tokens", 8_000, 7_000, 0.5),
    ]
    assert answers.ratelimit_headers(states) == [
        ("x-ratelimit-limit-requests", "10"),
        ("x-ratelimit-remaining-requests", "3"),
        ("x-ratelimit-reset-requests", "20s"),
        ("x-ratelimit-limit-tokens", "5000"),
        ("x-ratelimit-remaining-tokens", "700"),
        ("x-ratelimit-reset-tokens", "2.5s"),
    ]
    # Each value also goes to the metadata key the route's header is made from.
    assert [(h, k) for h, k, _ in answers.ratelimit_values(states)] == list(
        wire.RATELIMIT_HEADERS
    )


def test_ratelimit_values_tie_goes_to_the_longer_reset() -> None:
    states = [state("tokens", 100, 10, 5.0), state("output_tokens", 50, 10, 30.0)]
    assert answers.ratelimit_headers(states) == [
        ("x-ratelimit-limit-tokens", "50"),
        ("x-ratelimit-remaining-tokens", "10"),
        ("x-ratelimit-reset-tokens", "30s"),
    ]


def test_ratelimit_values_only_for_units_that_are_limited() -> None:
    assert answers.ratelimit_values([]) == []
    only_requests = answers.ratelimit_headers([state("requests", 5, 5, 0.0)])
    assert only_requests == [
        ("x-ratelimit-limit-requests", "5"),
        ("x-ratelimit-remaining-requests", "5"),
        ("x-ratelimit-reset-requests", "0ms"),
    ]
    assert answers.ratelimit_headers([state("requests", 5, 4, 360.0)]) == [
        ("x-ratelimit-limit-requests", "5"),
        ("x-ratelimit-remaining-requests", "4"),
        ("x-ratelimit-reset-requests", "6m0s"),
    ]


# ----- refusals ---------------------------------------------------------------------------

TOKENS = Limit("tenant", "demo", "tokens", 1000, 60.0)
REQUESTS = Limit("key", "demo-ci", "requests", 5, 10.0)
INPUT = Limit("model", "gpt-4o", "input_tokens", 400, 60.0)


def refusal(
    limit: Limit | None,
    *,
    used: int = 900,
    requested: int = 300,
    retry_after_s: float | None = 12.5,
    too_large: bool = False,
    others: tuple[LimitState, ...] = (),
) -> Decision:
    states = others
    if limit is not None:
        own = LimitState(limit, used, max(0, limit.limit - used), 42.0)
        states = (own, *others)
    return Decision(
        admitted=False,
        reservation_id="r1",
        states=states,
        refused_by=limit,
        requested=requested,
        retry_after_s=retry_after_s,
        too_large=too_large,
        store_mode="ok",
    )


def test_rate_limited_on_tokens_is_429_with_retry_after_and_ratelimit_headers() -> None:
    other = LimitState(REQUESTS, 1, 4, 3.0)
    status, err, headers = error(answers.refused(refusal(TOKENS, others=(other,))))
    assert status == 429
    assert (err["type"], err["code"], err["param"]) == ("tokens", "rate_limit_exceeded", None)
    assert err["message"] == (
        "Rate limit reached for tenant demo on tokens per min: limit 1000, used 900, "
        "requested 300. Please try again in 12.5s."
    )
    assert headers == {
        "content-type": "application/json",
        "x-ratelimit-limit-requests": "5",
        "x-ratelimit-remaining-requests": "4",
        "x-ratelimit-reset-requests": "3s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "100",
        "x-ratelimit-reset-tokens": "42s",
        "retry-after": "13",
        wire.REFUSAL_HEADER: "rate_limit_exceeded",
    }


def test_rate_limited_on_requests_is_type_requests() -> None:
    decision = refusal(REQUESTS, used=5, requested=1, retry_after_s=0.2)
    status, err, headers = error(answers.refused(decision))
    assert (status, err["type"], err["code"]) == (429, "requests", "rate_limit_exceeded")
    assert "key demo-ci on requests per 10s: limit 5, used 5, requested 1" in err["message"]
    assert err["message"].endswith("Please try again in 200ms.")
    assert headers["retry-after"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-limit-tokens" not in headers


def test_rate_limited_on_input_tokens_is_type_tokens() -> None:
    _, err, headers = error(answers.refused(refusal(INPUT, used=390, requested=50)))
    assert (err["type"], err["code"]) == ("tokens", "rate_limit_exceeded")
    assert "model gpt-4o on input tokens per min" in err["message"]
    assert headers["x-ratelimit-limit-tokens"] == "400"


def test_request_too_large_says_do_not_retry() -> None:
    decision = refusal(TOKENS, used=0, requested=5000, retry_after_s=None, too_large=True)
    status, err, headers = error(answers.refused(decision))
    assert status == 429
    assert (err["type"], err["code"]) == ("tokens", "request_too_large")
    assert "limit 1000, requested 5000" in err["message"]
    assert "retrying cannot help" in err["message"]
    assert headers["x-should-retry"] == "false"
    assert "retry-after" not in headers
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers[wire.REFUSAL_HEADER] == "request_too_large"


def test_refused_without_a_retry_time_is_too_large_too() -> None:
    _, err, headers = error(answers.refused(refusal(TOKENS, retry_after_s=None)))
    assert err["code"] == "request_too_large"
    assert headers["x-should-retry"] == "false" and "retry-after" not in headers


def test_store_unavailable_is_503() -> None:
    answer = answers.refused(refusal(None, retry_after_s=None))
    assert answer == answers.STORE_UNAVAILABLE
    status, err, headers = error(answer)
    assert (status, err["type"], err["code"]) == (503, "server_error", "rate_limiter_unavailable")
    assert headers["retry-after"] == "1"
    assert headers[wire.REFUSAL_HEADER] == "rate_limiter_unavailable"
    assert not any(key.startswith("x-ratelimit") for key in headers)


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        ("queue_full", "queue_full"),
        ("queue_timeout", "queue_timeout"),
        ("displaced", "queue_displaced"),
    ],
)
def test_shed_is_503_with_the_reason(reason: ShedReason, code: str) -> None:
    assert reason in SHED_REASONS
    shed = Shed(
        reason,
        "batch",
        retry_after_s=7,
        queued_s=0.5,
        message="the batch queue of route chat is full (3 waiting)",
    )
    status, err, headers = error(answers.shed(shed))
    assert (status, err["type"], err["code"], err["param"]) == (503, "server_error", code, None)
    assert err["message"] == (
        "The gateway is at capacity: the batch queue of route chat is full (3 waiting). "
        "Please retry in 7s."
    )
    assert headers == {
        "content-type": "application/json",
        "retry-after": "7",
        wire.REFUSAL_HEADER: code,
    }


def test_model_forbidden_is_403() -> None:
    status, err, _ = error(answers.model_forbidden("narrow", "gpt-4o"))
    assert (status, err["type"]) == (403, "invalid_request_error")
    assert (err["param"], err["code"]) == ("model", "model_not_allowed")
    assert err["message"] == "Your key (tenant narrow) may not use the model `gpt-4o`."


def test_model_forbidden_shortens_a_huge_model_name() -> None:
    _, err, _ = error(answers.model_forbidden("narrow", "m" * 10_000))
    assert "m" * 200 + "…" in err["message"]
    assert len(err["message"]) < 300


def test_bad_priority_is_400_listing_the_allowed_classes() -> None:
    status, err, _ = error(answers.bad_priority("interactive", ["standard", "batch"]))
    assert (status, err["type"]) == (400, "invalid_request_error")
    assert (err["param"], err["code"]) == (wire.PRIORITY_HEADER, "invalid_priority")
    assert err["message"] == (
        "Header x-sluicegate-priority is 'interactive'; your key may use: standard, batch."
    )
    _, err, _ = error(answers.bad_priority("x" * 1000, ["batch"]))
    assert "'" + "x" * 40 + "…'" in err["message"]


@pytest.mark.parametrize(
    ("answer", "code"),
    [(answers.MISSING_KEY, "missing_api_key"), (answers.INVALID_KEY, "invalid_api_key")],
)
def test_key_errors_are_401_with_www_authenticate(answer: bytes, code: str) -> None:
    status, err, headers = error(answer)
    assert (status, err["type"], err["code"]) == (401, "invalid_request_error", code)
    assert headers["www-authenticate"] == "Bearer"
