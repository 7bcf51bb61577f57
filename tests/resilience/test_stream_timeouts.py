"""`timeouts.first_token`: a streamed request leaves a hung provider within it (issue 9,
part 6), while non-streamed answers keep the longer `first_byte`.

Each route here has `first_byte` at 60 s and `first_token` at 1 s, and every client gives
up after 20 s: an answer that arrives at all shows which timer applied, with no timing
assertion. The translation tests check the stream twin itself (streams.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from sluicegate.config import load_config_text
from sluicegate.model import build_model
from sluicegate.provider.thread import ThreadedMockProvider
from sluicegate.xds.translate import routes as routes_module
from sluicegate.xds.translate.streams import STREAM_HEADER, stream_twin
from tests.e2e.stack import Stack

from .harness import HELLO, client, document, gateway, mock, post, requests_total, stats

CLIENT_TIMEOUT_S = 20.0  # well below first_byte: only first_token can end an attempt
SPLIT = {"first_byte": "60s", "first_token": "1s", "idle": "2m"}


@dataclass
class Setup:
    stack: Stack
    frozen: ThreadedMockProvider
    healthy: ThreadedMockProvider


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp: Path = tmp_path_factory.mktemp("stream_timeouts")
    with ExitStack() as running:
        # Accepts every request and never answers, like a provider frozen mid-incident.
        frozen = mock("frozen", rate_hang=1.0)
        running.callback(frozen.close)
        healthy = mock("healthy")
        running.callback(healthy.close)
        providers = [
            {"name": name, "base_url": f"http://127.0.0.1:{provider.port}/v1"}
            for name, provider in (("frozen", frozen), ("healthy", healthy))
        ]
        routes: list[dict[str, Any]] = [
            # The frozen provider first, the healthy one as fallback: every request tries
            # the frozen one first (no ejection, so it stays first for every test).
            {
                "name": "failover",
                "models": ["failover"],
                "backends": [
                    {"provider": "frozen", "priority": 0},
                    {"provider": "healthy", "priority": 1},
                ],
                "timeouts": SPLIT,
                "retries": {"max_retries": 1},
                "outlier_detection": {"enabled": False},
            },
            {
                "name": "slow",
                "models": ["slow"],
                "backends": [{"provider": "healthy"}],
                "timeouts": SPLIT,
                "retries": {"max_retries": 0},
            },
        ]
        with gateway(tmp, document(providers, routes)) as stack:
            yield Setup(stack, frozen, healthy)


def _stream(stack: Stack, model: str, **headers: str) -> list[str]:
    chunks = client(stack, timeout=CLIENT_TIMEOUT_S).chat.completions.create(
        model=model, messages=HELLO, stream=True, extra_headers=headers
    )
    return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]


@pytest.mark.e2e
def test_a_stream_leaves_a_hung_provider_within_first_token(setup: Setup) -> None:
    frozen_before, healthy_before = requests_total(setup.frozen), requests_total(setup.healthy)
    pieces = _stream(setup.stack, "failover")
    assert len(pieces) == 4  # the whole stream, from the fallback
    assert requests_total(setup.frozen) == frozen_before + 1
    assert requests_total(setup.healthy) == healthy_before + 1
    counters = stats(setup.stack, "route-failover")
    assert counters["upstream_rq_per_try_timeout"] >= 1
    assert counters["upstream_rq_retry_success"] >= 1


@pytest.mark.e2e
def test_a_streams_slow_first_token_is_a_504_when_retries_run_out(setup: Setup) -> None:
    before = stats(setup.stack, "route-slow").get("upstream_rq_per_try_timeout", 0)
    with pytest.raises(openai.APIStatusError) as raised:
        _stream(setup.stack, "slow", **{"x-mock-ttft-ms": "3000"})
    assert raised.value.status_code == 504
    body: Any = raised.value.body
    assert body["code"] == "upstream_timeout", body
    assert stats(setup.stack, "route-slow")["upstream_rq_per_try_timeout"] == before + 1


@pytest.mark.e2e
def test_a_non_streamed_answer_is_not_held_to_first_token(setup: Setup) -> None:
    """Its headers come only when the whole answer is done: first_byte (60 s) applies."""
    answer = post(setup.stack, "slow", {"x-mock-ttft-ms": "3000"}, timeout=CLIENT_TIMEOUT_S)
    assert answer.status == 200, answer.body
    assert answer.body["choices"][0]["message"]["content"]


@pytest.mark.e2e
def test_a_client_cannot_claim_a_stream(setup: Setup) -> None:
    """A client-sent stream header is dropped before routing: a non-streamed request that
    carries it still gets first_byte, not first_token."""
    answer = post(
        setup.stack,
        "slow",
        {"x-mock-ttft-ms": "3000", STREAM_HEADER: "true"},
        timeout=CLIENT_TIMEOUT_S,
    )
    assert answer.status == 200, answer.body


# --- the twin, as translated -----------------------------------------------------------

CONFIG = """\
version: 1
admission: {lane: exact}    # the routing stage's model routes (headers)
listeners: [{name: gw, port: 10000}]
providers:
  - {name: a, base_url: "http://127.0.0.1:8101/v1"}
  - {name: b, base_url: "http://127.0.0.1:8102/v1"}
defaults:
  timeouts: {first_byte: 2m, first_token: 7s}
routes:
  - name: chat
    models: [m]
    backends: [{provider: a}, {provider: b}]
"""


def _model_routes(text: str) -> list[Any]:
    gateway_ = build_model(load_config_text(text, "t.yaml"), {}, frozenset())
    (config,) = routes_module.build_route_configurations(gateway_)
    return [r for r in config.virtual_hosts[0].routes if r.name == "chat"]


def _twin_and_plain(text: str) -> tuple[Any, Any]:
    gateway_ = build_model(load_config_text(text, "t.yaml"), {}, frozenset())
    (route,) = gateway_.routes
    plain = routes_module._model_route(route, "m")
    return stream_twin(plain, route), plain


def test_the_twin_matches_streams_only_and_waits_first_token() -> None:
    twin, plain = _twin_and_plain(CONFIG)
    assert [h.name for h in twin.match.headers] == [
        *(h.name for h in plain.match.headers), STREAM_HEADER,
    ]  # fmt: skip
    assert twin.match.headers[-1].present_match
    assert twin.route.retry_policy.per_try_timeout.seconds == 7
    assert plain.route.retry_policy.per_try_timeout.seconds == 120
    # Everything else is the plain route's: cluster, total, retries, idle, metadata.
    assert twin.route.cluster == plain.route.cluster
    assert twin.route.timeout == plain.route.timeout
    assert twin.route.retry_policy.num_retries == plain.route.retry_policy.num_retries
    assert twin.route.retry_policy.retry_host_predicate == (
        plain.route.retry_policy.retry_host_predicate
    )
    assert twin.metadata == plain.metadata
    # The header is the gateway's word to itself, not for providers.
    assert list(twin.request_headers_to_remove) == [STREAM_HEADER]


def test_first_token_zero_leaves_streams_without_a_per_attempt_timer() -> None:
    twin, plain = _twin_and_plain(CONFIG.replace("first_token: 7s", "first_token: 0"))
    assert not twin.route.retry_policy.HasField("per_try_timeout")
    assert plain.route.retry_policy.per_try_timeout.seconds == 120


def test_a_route_without_retries_still_times_streams_out() -> None:
    text = CONFIG.replace(
        "first_token: 7s}", "first_token: 7s, idle: 0}\n  retries: {max_retries: 0}"
    ).replace("first_byte: 2m", "first_byte: 0")
    twin, plain = _twin_and_plain(text)
    assert not plain.route.HasField("retry_policy")
    assert twin.route.retry_policy.per_try_timeout.seconds == 7
    assert twin.route.retry_policy.num_retries.value == 0


def test_every_model_route_has_its_twin_first() -> None:
    """Once routes.py emits twins (with_stream_twin): the twin precedes its plain route."""
    found = _model_routes(CONFIG)
    assert len(found) == 2, "routes.py does not emit stream twins yet"
    twin, plain = found
    assert twin.match.headers[-1].name == STREAM_HEADER
    assert all(h.name != STREAM_HEADER for h in plain.match.headers)
