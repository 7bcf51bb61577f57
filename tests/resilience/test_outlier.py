"""Outlier detection and active health checks, end to end.

- a provider answering 503 to everything is ejected after 3 gateway failures
  (Envoy: outlier_detection.ejections_enforced_total); its failures were retried on the
  healthy provider, so clients saw no error; afterwards it gets no traffic at all;
- a provider refusing connections is ejected: by default its refused connections count as
  gateway failures, or apart when consecutive_local_origin_failure is set;
- a hung provider is ejected even with one client at a time (not in split mode);
- a provider answering 429 to everything is ejected too (Envoy alone ignores 429);
- an ejection lasts longer each time the provider is ejected again;
- active health checks keep a dead provider out before any request reaches it; a
  provider that wants a key is healthy (its key-less /models answers 401, below 500).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sluicegate.provider.thread import ThreadedMockProvider
from tests.e2e.stack import Stack

from .harness import (
    closed_port,
    document,
    gateway,
    mock,
    mocks,
    post,
    requests_total,
    stats,
    wait_for,
)

pytestmark = pytest.mark.e2e

FAST_BACKOFF = {"base": "10ms", "max": "50ms"}
KEY = "sk-keyed-provider-test"


@dataclass
class Setup:
    stack: Stack
    mocks: dict[str, ThreadedMockProvider]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp: Path = tmp_path_factory.mktemp("outlier")
    (tmp / "keyed.key").write_text(KEY + "\n")
    with (
        mocks(*"abcdefgh") as running,
        closing(mock("keyed", api_key=KEY)) as keyed,
    ):

        def url(name: str) -> str:
            return f"http://127.0.0.1:{running[name].port}/v1"

        checks = {"interval": "200ms", "timeout": "200ms", "unhealthy_threshold": 1}
        providers = [
            *({"name": name, "base_url": url(name)} for name in "abcdefgh"),
            {"name": "dead", "base_url": f"http://127.0.0.1:{closed_port()}/v1"},
            {"name": "down", "base_url": f"http://127.0.0.1:{closed_port()}/v1",
             "health_check": checks},
            {"name": "keyed", "base_url": f"http://127.0.0.1:{keyed.port}/v1",
             "api_key": {"file": "keyed.key"}, "health_check": checks},
        ]  # fmt: skip

        def route(name: str, backends: list[str], **overrides: Any) -> dict[str, Any]:
            return {"name": name, "models": [name], "retries": {"backoff": FAST_BACKOFF},
                    "backends": [{"provider": p} for p in backends], **overrides}  # fmt: skip

        routes = [
            route("eject", ["a", "b"]),  # the defaults: 3 gateway failures eject
            route("eject-local", ["dead", "b"],
                  outlier_detection={"consecutive_local_origin_failure": 3}),
            route("regrow", ["c", "d"],
                  outlier_detection={"interval": "500ms", "base_ejection_time": "1s",
                                     "max_ejection_time": "10s"}),
            route("checked", ["down", "keyed"]),
            # 429s count toward consecutive_5xx (5); the retry goes elsewhere at once.
            route("eject429", ["e", "f"], retries={"backoff": FAST_BACKOFF, "retry_after_max": 0}),
            # A hung provider: every attempt times out after first_byte.
            route("hung", ["g", "h"], timeouts={"first_byte": "300ms"}),
        ]  # fmt: skip
        with gateway(tmp, document(providers, routes)) as stack:
            yield Setup(stack, {**running, "keyed": keyed})


def fault_503(provider: str) -> dict[str, str]:
    return {"x-mock-fault": "503", "x-mock-fault-provider": provider}


def test_failing_provider_is_ejected_and_clients_see_no_error(setup: Setup) -> None:
    a, b = setup.mocks["a"], setup.mocks["b"]
    answers = [post(setup.stack, "eject", fault_503("a")) for _ in range(20)]
    assert [x.status for x in answers] == [200] * 20  # a's 503s were retried on b
    counters = stats(setup.stack, "route-eject")
    assert counters["outlier_detection.ejections_enforced_total"] == 1
    assert counters["outlier_detection.ejections_enforced_consecutive_gateway_failure"] == 1
    assert counters["outlier_detection.ejections_active"] == 1
    assert requests_total(a) == 3  # ejected after its 3rd consecutive 503
    # While ejected, a gets nothing: no failed first attempts, no retries.
    retries = counters["upstream_rq_retry"]
    answers = [post(setup.stack, "eject", fault_503("a")) for _ in range(10)]
    assert [x.status for x in answers] == [200] * 10
    assert requests_total(a) == 3
    assert stats(setup.stack, "route-eject")["upstream_rq_retry"] == retries
    assert requests_total(b) == 30


def test_provider_refusing_connections_is_ejected_by_local_origin_failures(
    setup: Setup,
) -> None:
    answers = [post(setup.stack, "eject-local") for _ in range(15)]
    assert [x.status for x in answers] == [200] * 15
    counters = stats(setup.stack, "route-eject-local")
    assert counters["outlier_detection.ejections_enforced_consecutive_local_origin_failure"] == 1
    assert counters["upstream_cx_connect_fail"] == 3
    # Ejected: the next requests never try the dead provider.
    for _ in range(10):
        assert post(setup.stack, "eject-local").status == 200
    assert stats(setup.stack, "route-eject-local")["upstream_cx_connect_fail"] == 3


def _ejected_for(stack: Stack, provider: str) -> float:
    """Send failing requests until `provider` is ejected; return how long it stays out."""
    route = "route-regrow"

    def active() -> int:
        return stats(stack, route).get("outlier_detection.ejections_active", 0)

    deadline = time.monotonic() + 10
    while active() == 0:
        assert post(stack, "regrow", fault_503(provider)).status == 200
        assert time.monotonic() < deadline, "never ejected"
    ejected_at = time.monotonic()
    wait_for(lambda: active() == 0, timeout_s=15, what="un-ejection")
    return time.monotonic() - ejected_at


def test_ejection_lasts_longer_each_time(setup: Setup) -> None:
    """base_ejection_time 1 s, checked every 500 ms: the first ejection lasts 1-1.5 s, the
    next one 2-2.5 s. (Envoy shortens it again for each interval the provider spends
    un-ejected, so the test fails it again right away.)"""
    first = _ejected_for(setup.stack, "c")
    second = _ejected_for(setup.stack, "c")
    assert 0.9 < first < 1.8, first
    assert 1.9 < second < 2.9, second
    assert stats(setup.stack, "route-regrow")["outlier_detection.ejections_enforced_total"] == 2


def test_active_health_checks_keep_a_dead_provider_out(setup: Setup) -> None:
    keyed = setup.mocks["keyed"]

    def checks() -> dict[str, int]:
        return stats(setup.stack, "route-checked")

    wait_for(lambda: checks().get("health_check.failure", 0) >= 2, what="failed checks")
    wait_for(lambda: checks().get("membership_healthy") == 1, what="one healthy provider")
    answers = [post(setup.stack, "checked") for _ in range(10)]
    assert [x.status for x in answers] == [200] * 10
    assert {x.headers["x-mock-provider"] for x in answers} == {"keyed"}
    counters = checks()
    assert counters.get("upstream_cx_connect_fail", 0) == 0  # no request tried `down`
    assert counters.get("upstream_rq_retry", 0) == 0
    # The keyed provider's checks: GET /v1/models with its Host and without any key
    # (health checks skip the per-attempt filters), answered 401, which counts as healthy.
    recent = keyed.stats()["recent_requests"]
    probes = [r for r in recent if r["path"] == "/v1/models"]
    assert probes, recent
    assert all(not r["authorization_present"] and r["status"] == 401 for r in probes)
    assert probes[-1]["headers"]["host"] == f"127.0.0.1:{keyed.port}"


def test_provider_answering_429_to_everything_is_ejected(setup: Setup) -> None:
    e, f = setup.mocks["e"], setup.mocks["f"]
    fault = {"x-mock-fault": "429", "x-mock-fault-provider": "e"}
    answers = [post(setup.stack, "eject429", fault) for _ in range(20)]
    assert [x.status for x in answers] == [200] * 20  # e's 429s were retried on f
    counters = stats(setup.stack, "route-eject429")
    assert counters["outlier_detection.ejections_enforced_consecutive_5xx"] == 1
    assert counters["outlier_detection.ejections_active"] == 1
    assert requests_total(e) == 5  # ejected after its 5th consecutive 429
    answers = [post(setup.stack, "eject429", fault) for _ in range(10)]
    assert [x.status for x in answers] == [200] * 10
    assert requests_total(e) == 5
    assert requests_total(f) == 30


def test_hung_provider_is_ejected_even_with_one_sequential_client(setup: Setup) -> None:
    """Each attempt on g connects fine, then times out. With connection successes counted
    apart from failures (Envoy's split mode), every new connection would reset g's count
    and one client at a time would never get it ejected."""
    g, h = setup.mocks["g"], setup.mocks["h"]
    fault = {"x-mock-fault": "hang", "x-mock-fault-provider": "g"}
    answers = [post(setup.stack, "hung", fault) for _ in range(12)]
    assert [x.status for x in answers] == [200] * 12  # each timed-out attempt retried on h
    counters = stats(setup.stack, "route-hung")
    assert counters["outlier_detection.ejections_active"] == 1
    assert requests_total(g) == 3  # ejected after 3 consecutive timeouts (gateway failures)
    assert requests_total(h) == 12
