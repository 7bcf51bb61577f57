"""Latency-aware routing end to end: `sluicegate up` with two mock providers on one
`routing: latency` route under steady load; one mock's time to first token rises 5x while
it runs, and its share of the answered requests falls below 20%, then, once it is fast
again, comes back to its configured share (docs/latency-routing.md).

Shares are counted by the mocks themselves (/mock/stats). Every wait is bounded; the
15 s and 60 s of the issue are the benchmark's to time (benchmarks/latency_routing.py).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.testing.steady_load import steady_load
from tests.e2e.stack import Stack, own_addresses, running_stack
from tests.ports import free_ports

pytestmark = pytest.mark.e2e

MODEL = "m"
TTFT_MS = 50
ENDPOINT_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def latency_doc() -> dict[str, Any]:
    listener, fast, slow = free_ports(3)
    return {
        "version": 1,
        "sluicegate": own_addresses(),
        "listeners": [{"name": "gateway", "address": "127.0.0.1", "port": listener}],
        "providers": [
            {
                "name": name,
                "base_url": f"http://127.0.0.1:{port}/v1",
                "mock": {"models": [MODEL], "ttft_ms": TTFT_MS, "itl_ms": 5, "output_tokens": 1},
            }
            for name, port in (("fast", fast), ("slow", slow))
        ],
        "routes": [
            {
                "name": "chat",
                "models": [MODEL],
                "routing": "latency",
                "backends": [{"provider": "fast"}, {"provider": "slow"}],
            }
        ],
    }


def _mock_url(stack: Stack, name: str) -> str:
    (provider,) = [p for p in stack.doc["providers"] if p["name"] == name]
    return str(provider["base_url"]).removesuffix("/v1")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def _configure(stack: Stack, name: str, changes: dict[str, Any]) -> None:
    request = urllib.request.Request(
        _mock_url(stack, name) + "/mock/config",
        data=json.dumps(changes).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


class Shares:
    """The mocks' answered-request counts, sampled; `slow`'s share over a recent window."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.history: list[tuple[float, int, int]] = []

    def sample(self) -> None:
        counts = [
            int(_get(_mock_url(self.stack, name) + "/mock/stats")["requests_total"])
            for name in ("fast", "slow")
        ]
        self.history.append((time.monotonic(), counts[0], counts[1]))

    def slow_share(self, window_s: float) -> float | None:
        now, fast, slow = self.history[-1]
        older = [entry for entry in self.history if entry[0] <= now - window_s]
        if not older:
            return None
        _, fast_then, slow_then = older[-1]
        answered = (fast - fast_then) + (slow - slow_then)
        return (slow - slow_then) / answered if answered else None

    def wait(self, done: Callable[[float], bool], window_s: float, timeout_s: float) -> float:
        """The first windowed share for which `done` holds (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        shown: list[str] = []
        while time.monotonic() < deadline:
            self.sample()
            share = self.slow_share(window_s)
            if share is not None:
                shown.append(f"{share:.2f}")
                if done(share):
                    return share
            time.sleep(0.25)
        routing = self.stack.status()["routing"]
        raise AssertionError(f"share never got there: {shown[-40:]}; routing: {routing}")


def _slow(stack: Stack) -> dict[str, Any]:
    slow: dict[str, Any] = stack.status()["routing"]["chat"]["slow"]
    return slow


def _wait_status(stack: Stack, done: Callable[[dict[str, Any]], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done(_slow(stack)):
        assert time.monotonic() < deadline, f"/status routing never got there: {_slow(stack)}"
        time.sleep(0.25)


def _gauges(stack: Stack) -> dict[str, dict[str, float]]:
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("sluicegate_provider_"):
                key = f"{sample.labels['route']}/{sample.labels['provider']}"
                found.setdefault(sample.name, {})[key] = sample.value
    return found


def test_a_slowed_provider_loses_its_share_and_gets_it_back(tmp_path: Path) -> None:
    with running_stack(tmp_path, latency_doc()) as stack:
        # Learned from the start, and both providers weighed as configured while equal.
        with steady_load(stack.gateway, MODEL, {}, clients=4) as load:
            _wait_status(stack, lambda slow: slow["samples"] >= 20, timeout_s=20)
            before = stack.status()["versions"]
            assert _slow(stack)["weight"] == _slow(stack)["configured_weight"] == 1

            shares = Shares(stack)
            _configure(stack, "slow", {"ttft_ms": 5 * TTFT_MS})
            shares.wait(lambda share: share < 0.20, window_s=3, timeout_s=30)
            slowed = _slow(stack)
            assert slowed["weight"] < 0.4  # of its configured 1 (its share below 20%)
            assert slowed["ttft_s"] > 3 * TTFT_MS / 1000
            gauges = _gauges(stack)
            assert gauges["sluicegate_provider_weight"]["chat/slow"] < 0.4
            assert gauges["sluicegate_provider_configured_weight"]["chat/slow"] == 1
            assert gauges["sluicegate_provider_ttft_smoothed_seconds"]["chat/slow"] > 0.15
            assert gauges["sluicegate_provider_error_rate"]["chat/slow"] == 0

            _configure(stack, "slow", {"ttft_ms": TTFT_MS})
            shares.wait(lambda share: 0.45 <= share <= 0.55, window_s=4, timeout_s=60)
            _wait_status(stack, lambda slow: slow["weight"] == 1, timeout_s=30)
            after = stack.status()["versions"]

        assert not [o for o in load.outcomes if not o.ok], "no request may fail"
        # Weight changes went out over EDS alone: no listener, route or cluster was resent.
        assert {t for t in before if before[t] != after[t]} <= {ENDPOINT_TYPE}
