"""A provider's concurrency gate and rate limits cover only the routes that send to it
alone: the validator warns about every route that mixes such a provider with others."""

from __future__ import annotations

import pytest

from sluicegate.config import Problem, load_config_text

from .helpers import problems_of, where

# Line numbers below count from here.
PROVIDERS = """\
version: 1
listeners:
  - name: gw
    port: 10000
providers:
  - name: alpha
    base_url: http://127.0.0.1:18081/v1
    concurrency: {max_requests: 4}
  - name: beta
    base_url: http://127.0.0.1:18082/v1
  - name: gamma
    base_url: http://127.0.0.1:18083/v1
    concurrency: {max_tokens: 1000}
    rate_limits: {requests: 100, tokens: 50000, per: 1m}
  - name: delta
    base_url: http://127.0.0.1:18084/v1
  - name: epsilon
    base_url: http://127.0.0.1:18085/v1
    rate_limits: {tokens: 1000}
routes:
"""
# Every provider alone in a route (so none is unused), five routes: routes[0..4].
SOLO = "".join(
    f"  - name: solo-{name}\n    models: [{name}-m]\n    backends: [{{provider: {name}}}]\n"
    for name in ("alpha", "beta", "gamma", "delta", "epsilon")
)


def route(name: str, *providers: str, extra: str = "") -> str:
    backends = ", ".join(f"{{provider: {p}}}" for p in providers)
    return f"  - name: {name}\n    models: [{name}-m]\n    backends: [{backends}]\n{extra}"


def check_warning(problem: Problem, route_name: str, provider: str, index: int) -> None:
    assert problem.severity == "warning" and not problem.is_error, problem
    field = problem.key_path.rsplit(".", 1)[1]
    assert field in ("concurrency", "rate_limits")
    assert problem.message.startswith(
        f"route '{route_name}' sends to '{provider}' and other providers, so this {field} "
        "does not cover it"
    ), problem.message
    assert problem.message.endswith(f"; at routes[{index}]"), problem.message


def test_single_provider_routes_raise_no_warning() -> None:
    assert problems_of(PROVIDERS + SOLO) == []


def test_route_mixing_a_gated_provider_warns_at_the_gate() -> None:
    problems = problems_of(PROVIDERS + SOLO + route("mixed", "alpha", "beta"))
    assert where(problems) == [(8, "providers[0].concurrency")]
    check_warning(problems[0], "mixed", "alpha", 5)


def test_route_mixing_a_rate_limited_provider_warns_at_its_limits() -> None:
    problems = problems_of(PROVIDERS + SOLO + route("mixed", "beta", "epsilon"))
    assert where(problems) == [(19, "providers[4].rate_limits")]
    check_warning(problems[0], "mixed", "epsilon", 5)


def test_every_gate_and_limit_of_a_mixed_route_is_named() -> None:
    problems = problems_of(PROVIDERS + SOLO + route("mixed", "gamma", "beta", "alpha"))
    assert sorted(where(problems)) == [
        (8, "providers[0].concurrency"),
        (13, "providers[2].concurrency"),
        (14, "providers[2].rate_limits"),
    ]
    for problem in problems:
        provider = "alpha" if problem.key_path.startswith("providers[0]") else "gamma"
        check_warning(problem, "mixed", provider, 5)


def test_one_warning_per_mixed_route() -> None:
    text = PROVIDERS + SOLO + route("first", "alpha", "delta") + route("second", "delta", "alpha")
    problems = problems_of(text)
    assert where(problems) == [(8, "providers[0].concurrency")] * 2
    check_warning(problems[0], "first", "alpha", 5)
    check_warning(problems[1], "second", "alpha", 6)


@pytest.mark.parametrize("providers", [("beta", "delta"), ("delta", "beta")])
def test_mixed_route_of_plain_providers_raises_no_warning(providers: tuple[str, str]) -> None:
    assert problems_of(PROVIDERS + SOLO + route("mixed", *providers)) == []


def test_route_gate_does_not_silence_the_provider_gate_warning() -> None:
    extra = "    concurrency: {max_requests: 2}\n"
    problems = problems_of(PROVIDERS + SOLO + route("mixed", "alpha", "beta", extra=extra))
    assert where(problems) == [(8, "providers[0].concurrency")]


def test_warning_does_not_stop_the_config_from_loading() -> None:
    config = load_config_text(PROVIDERS + SOLO + route("mixed", "alpha", "beta"), "t.yaml")
    assert config.routes[-1].name == "mixed"
    alpha = config.providers[0]
    assert alpha.concurrency is not None and alpha.concurrency.max_requests == 4
