"""`sluicegate status` on the quickstart, end to end: each route's providers as `up`'s
Envoy holds them, in the text form, in `--json` and in the host gauges on /metrics.

A provider is made unhealthy by outlier ejection (its 503s, aimed at it alone with the
mock's `x-mock-fault-provider`): a killed mock is restarted by `up` within a fraction of
a second, too soon for a test to see reliably, while an ejection lasts the quickstart's
30 s `base_ejection_time`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import Stack, running_stack

pytestmark = pytest.mark.e2e

DEMO_KEY = "sk-sluicegate-demo"
BETA_FAILS = {"x-mock-fault": "503", "x-mock-fault-provider": "beta"}
T = TypeVar("T")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("status")
    with running_stack(tmp, quickstart_on_free_ports(tmp)) as running:
        yield running


def eventually(read: Callable[[], T], done: Callable[[T], bool], timeout_s: float = 15) -> T:
    """`read()` once `done` holds of it, or its last value after timeout_s."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.2)
        value = read()
    return value


def status(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluicegate", "status",
         "--address", stack.doc["sluicegate"]["http"], *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def provider_rows(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """The text form's Providers table: (route, provider) -> column -> cell."""
    lines = text.split("\nProviders\n", 1)[1].split("\n\n", 1)[0].splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.strip().startswith("ROUTE")]

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().split("  ") if cell.strip()]

    header = cells(lines[start])
    rows = [dict(zip(header, cells(line), strict=True)) for line in lines[start + 1 :]]
    return {(row["ROUTE"], row["PROVIDER"]): row for row in rows}


def gauges(stack: Stack) -> dict[tuple[str, str, str], float]:
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels["route"], sample.labels["provider"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name in ("sluicegate_provider_healthy_hosts", "sluicegate_provider_ejected_hosts")
        for sample in family.samples
    }


def mini(document: dict[str, Any]) -> dict[str, Any]:
    return dict((document.get("providers") or {}).get("mini", {}))


def chat(stack: Stack, headers: dict[str, str]) -> int:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {DEMO_KEY}",
                 **headers},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_both_providers_of_a_route_are_healthy_with_their_weights(stack: Stack) -> None:
    # Envoy checks each provider once before it uses the route's cluster; bounded anyway.
    document = eventually(stack.status, lambda d: {p["healthy"] for p in mini(d).values()} == {1})
    assert {name: (p["healthy"], p["hosts"], p["ejected"], p["weight"])
            for name, p in mini(document).items()} == {
        "alpha": (1, 1, 0, 3), "beta": (1, 1, 0, 1)
    }  # fmt: skip

    shown = status(stack)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    rows = provider_rows(shown.stdout)
    alpha, beta = rows[("mini", "alpha")], rows[("mini", "beta")]
    assert (alpha["HEALTHY"], alpha["EJECTED"], alpha["WEIGHT"], alpha["SHARE"]) == (
        "1/1", "0", "3", "75%"
    )  # fmt: skip
    assert (beta["HEALTHY"], beta["EJECTED"], beta["WEIGHT"], beta["SHARE"]) == (
        "1/1", "0", "1", "25%"
    )  # fmt: skip
    if "routing" in document:  # the control plane's weights (issue 10, part 2)
        assert (alpha["CONFIGURED"], beta["CONFIGURED"]) == ("3", "1")
    for title in ("Config", "Envoys", "Providers", "Processes", "Admission"):
        assert f"\n{title}\n" in "\n" + shown.stdout

    as_json = status(stack, "--json")
    assert as_json.returncode == 0, as_json.stderr
    printed = json.loads(as_json.stdout)
    assert mini(printed)["beta"]["healthy"] == 1 and mini(printed)["alpha"]["weight"] == 3

    found = gauges(stack)
    assert found[("sluicegate_provider_healthy_hosts", "mini", "alpha")] == 1
    assert found[("sluicegate_provider_healthy_hosts", "mini", "beta")] == 1
    assert found[("sluicegate_provider_ejected_hosts", "mini", "beta")] == 0


def test_an_ejected_provider_is_unhealthy_in_status_and_gauges(stack: Stack) -> None:
    """beta answers every attempt with 503 (retried on alpha, so clients see 200) until
    Envoy ejects it, after its third gateway failure in a row."""
    deadline = time.monotonic() + 20
    while mini(stack.status())["beta"]["ejected"] == 0:
        assert chat(stack, BETA_FAILS) == 200
        assert time.monotonic() < deadline, "beta was never ejected"
    assert mini(stack.status())["beta"]["healthy"] == 0
    assert mini(stack.status())["alpha"]["healthy"] == 1

    shown = status(stack)
    # A provider's health is not among the exit rules: nothing of the stack is down.
    assert shown.returncode == 0, shown.stdout + shown.stderr
    beta = provider_rows(shown.stdout)[("mini", "beta")]
    assert (beta["HEALTHY"], beta["EJECTED"]) == ("0/1", "1")
    # Ejected from this route's cluster only: beta's other route still has it.
    assert provider_rows(shown.stdout)[("deepseek", "beta")]["HEALTHY"] == "1/1"
    assert mini(json.loads(status(stack, "--json").stdout))["beta"]["ejected"] == 1

    found = gauges(stack)
    assert found[("sluicegate_provider_ejected_hosts", "mini", "beta")] == 1
    assert found[("sluicegate_provider_healthy_hosts", "mini", "beta")] == 0
    assert found[("sluicegate_provider_healthy_hosts", "deepseek", "beta")] == 1
