"""Retries, end to end: what a failing provider costs the client, and what it costs the
providers.

- 503, 429 (with Retry-After), a reset, a refused connection and a slow first byte on
  provider `a` all end in a 200 from provider `b`: Envoy retries on another provider;
- Retry-After is honoured: the retry after a 429 with `Retry-After: 1` waits 1-1.5 s;
- all providers failing: exactly 1 + max_retries attempts per request, whatever
  x-envoy-* headers the client sends;
- a stream cut mid-way is never retried (the client saw bytes): one attempt, no duplicate;
- under concurrency the retry budget caps the attempts.

Outlier detection is off on these routes so that ejection does not hide the retries.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from sluicegate.provider.thread import ThreadedMockProvider
from tests.e2e.stack import Stack

from .harness import (
    HELLO,
    client,
    closed_port,
    document,
    gateway,
    mocks,
    post,
    requests_total,
    stats,
)

pytestmark = pytest.mark.e2e

FAST_BACKOFF = {"base": "10ms", "max": "50ms"}
NO_EJECTION = {"enabled": False}


@dataclass
class Setup:
    stack: Stack
    a: ThreadedMockProvider
    b: ThreadedMockProvider

    def counts(self) -> tuple[int, int]:
        return requests_total(self.a), requests_total(self.b)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp: Path = tmp_path_factory.mktemp("retries")
    with mocks("a", "b") as running:
        providers = [
            {"name": "a", "base_url": f"http://127.0.0.1:{running['a'].port}/v1"},
            {"name": "b", "base_url": f"http://127.0.0.1:{running['b'].port}/v1"},
            {"name": "dead", "base_url": f"http://127.0.0.1:{closed_port()}/v1"},
        ]

        def route(name: str, backends: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
            return {"name": name, "models": [name], "backends": backends, **overrides}

        retries = {"backoff": FAST_BACKOFF}
        routes = [
            # a first, b only as the fallback: every first attempt goes to a.
            route("ordered", [{"provider": "a"}, {"provider": "b", "priority": 1}],
                  retries=retries, timeouts={"first_byte": "500ms", "idle": "2s"},
                  outlier_detection=NO_EJECTION),
            route("spread", [{"provider": "a"}, {"provider": "b"}],
                  retries=retries, outlier_detection=NO_EJECTION),
            route("dead-first", [{"provider": "dead"}, {"provider": "b", "priority": 1}],
                  retries=retries, outlier_detection=NO_EJECTION),
            route("all", [{"provider": "a"}, {"provider": "b"}],
                  retries={**retries, "max_retries": 2}, outlier_detection=NO_EJECTION),
            route("budget", [{"provider": "a"}, {"provider": "b"}],
                  retries={**retries, "max_retries": 2,
                           "budget": {"percent": 20, "min_concurrency": 3}},
                  timeouts={"first_byte": "300ms", "idle": "1s"},
                  outlier_detection=NO_EJECTION),
        ]  # fmt: skip
        with gateway(tmp, document(providers, routes)) as stack:
            yield Setup(stack, running["a"], running["b"])


def fault(kind: str, provider: str | None = "a", **extra: str) -> dict[str, str]:
    headers = {"x-mock-fault": kind, **extra}
    if provider is not None:
        headers["x-mock-fault-provider"] = provider
    return headers


@pytest.mark.parametrize(
    "headers",
    [fault("503"), fault("500"), fault("reset"), fault("hang")],
    ids=["503", "500-not-retried", "reset", "slow-first-byte"],
)
def test_failure_on_first_provider_is_retried_on_the_other(
    setup: Setup, headers: dict[str, str]
) -> None:
    before = setup.counts()
    answer = post(setup.stack, "ordered", headers)
    a, b = (after - was for after, was in zip(setup.counts(), before, strict=True))
    if headers["x-mock-fault"] == "500":
        # 500 is not in retry_on by default: it may be about this very request.
        assert (answer.status, a, b) == (500, 1, 0), answer.body
        return
    assert answer.status == 200, answer.body
    assert answer.headers["x-mock-provider"] == "b"
    assert (a, b) == (1, 1)


def test_429_waits_for_retry_after_then_another_provider_answers(setup: Setup) -> None:
    before = setup.counts()
    answer = post(setup.stack, "ordered", fault("429", **{"x-mock-retry-after": "1"}))
    assert answer.status == 200, answer.body
    assert answer.headers["x-mock-provider"] == "b"
    # Envoy waits random [Retry-After, 1.5 x Retry-After) before retrying.
    assert 1.0 <= answer.seconds < 2.0, answer.seconds
    assert setup.counts() == (before[0] + 1, before[1] + 1)
    assert stats(setup.stack, "route-ordered")["upstream_rq_retry_backoff_ratelimited"] >= 1


def test_connection_refused_is_retried_on_the_other_provider(setup: Setup) -> None:
    before = setup.counts()
    answer = post(setup.stack, "dead-first")
    assert answer.status == 200, answer.body
    assert answer.headers["x-mock-provider"] == "b"
    assert setup.counts() == (before[0], before[1] + 1)
    assert stats(setup.stack, "route-dead-first")["upstream_cx_connect_fail"] >= 1


def test_each_retry_goes_to_the_provider_not_yet_tried(setup: Setup) -> None:
    """Equal weights; a always answers 503: every request still ends at b, never a twice."""
    before = setup.counts()
    answers = [post(setup.stack, "spread", fault("503")) for _ in range(20)]
    assert [x.status for x in answers] == [200] * 20
    assert {x.headers["x-mock-provider"] for x in answers} == {"b"}
    a, b = (after - was for after, was in zip(setup.counts(), before, strict=True))
    assert b == 20 and 1 <= a <= 20  # a is tried at most once per request


def test_all_providers_failing_costs_exactly_one_plus_max_retries(setup: Setup) -> None:
    """Clients cannot ask for more: x-envoy-* request headers are dropped by the gateway."""
    before = setup.counts()
    greedy = {"x-envoy-max-retries": "10", "x-envoy-retry-on": "5xx,reset",
              "x-envoy-upstream-rq-per-try-timeout-ms": "1"}  # fmt: skip
    for _ in range(5):
        answer = post(setup.stack, "all", {**fault("503", provider=None), **greedy})
        # The last provider answer, unchanged: its OpenAI error, not a gateway one.
        assert answer.status == 503
        assert answer.body["error"]["code"] == "service_unavailable"
    attempts = sum(setup.counts()) - sum(before)
    assert attempts == 5 * (1 + 2)


def test_stream_cut_midway_is_not_retried_or_duplicated(setup: Setup) -> None:
    before = setup.counts()
    pieces: list[str] = []
    chunks = client(setup.stack).chat.completions.create(
        model="ordered", messages=HELLO, stream=True,
        extra_headers={**fault("cut"), "x-mock-output-tokens": "10"},
    )  # fmt: skip
    with pytest.raises(openai.APIConnectionError):
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
    assert len(pieces) == 5  # half of the tokens, then the provider dropped the connection
    time.sleep(0.2)
    assert setup.counts() == (before[0] + 1, before[1])  # one attempt; b never asked


def test_retry_budget_caps_retries_under_concurrency(setup: Setup) -> None:
    """30 requests at once, every attempt hangs until its 300 ms first-byte timeout. Without
    a budget that is 90 attempts; the budget allows retries for at most 20% of the requests
    in flight (at least 3) at a time."""
    clients = 30
    before = setup.counts()
    overflow_before = stats(setup.stack, "route-budget").get("upstream_rq_retry_overflow", 0)
    with ThreadPoolExecutor(clients) as pool:
        answers = list(
            pool.map(lambda _: post(setup.stack, "budget", fault("hang", provider=None)),
                     range(clients))
        )  # fmt: skip
    assert {x.status for x in answers} == {504}
    assert {x.body["error"]["code"] for x in answers} == {"upstream_timeout"}
    time.sleep(0.3)
    attempts = sum(setup.counts()) - sum(before)
    counters = stats(setup.stack, "route-budget")
    assert counters["upstream_rq_retry_overflow"] > overflow_before
    assert clients <= attempts <= clients * 1.5, attempts  # not 90
