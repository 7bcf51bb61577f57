"""Priority under overload (issue 4): a provider that serves 4 requests at once, flooded by
interactive and batch clients. Interactive is never shed and waits well within its
max_wait; batch is shed with 503 and Retry-After. Real Envoy, real ext_proc, mock provider.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sluicegate.config import hash_key
from tests.e2e.stack import Stack, own_addresses, running_stack
from tests.ports import free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

KEYS = {"fg": "sk-test-foreground-0123456789", "bg": "sk-test-background-0123456789"}
INTERACTIVE_MAX_WAIT_S = 5.0
PROVIDER_TTFT_MS = 200
LOAD_S = 6.0


def document() -> dict[str, Any]:
    listen, slow = free_ports(2)
    return {
        "version": 1,
        "sluicegate": own_addresses(),
        "admission": {
            "priority_classes": [
                {
                    "name": "interactive",
                    "max_queue": 64,
                    "max_wait": f"{INTERACTIVE_MAX_WAIT_S:g}s",
                },
                {"name": "batch", "max_queue": 4, "max_wait": "1s"},
            ],
            "default_priority": "batch",
        },
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "providers": [
            {
                "name": "slowpoke",
                "base_url": f"http://127.0.0.1:{slow}/v1",
                "mock": {
                    "models": [],
                    "ttft_ms": PROVIDER_TTFT_MS,
                    "itl_ms": 1,
                    "output_tokens": 4,
                },
                # A self-hosted model that serves 4 requests at once; 1 kept for interactive.
                "concurrency": {"max_requests": 4, "headroom": 0.25},
            }
        ],
        "routes": [{"name": "work", "models": ["work"], "backends": [{"provider": "slowpoke"}]}],
        "tenants": [
            {
                "name": "fg",
                "priority": "interactive",
                "keys": [{"name": "fg-key", "hash": hash_key(KEYS["fg"])}],
            },
            {
                "name": "bg",
                "priority": "batch",
                "keys": [{"name": "bg-key", "hash": hash_key(KEYS["bg"])}],
            },
        ],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("priority")
    with running_stack(tmp, document()) as running:
        yield running


Result = tuple[str, int, str | None, str | None]  # tenant, status, error code, retry-after


async def overload(gateway: str) -> list[Result]:
    """6 interactive and 12 batch closed-loop clients for LOAD_S seconds."""
    results: list[Result] = []
    deadline = time.monotonic() + LOAD_S
    async with aiohttp.ClientSession() as session:

        async def client(tenant: str) -> None:
            headers = {"authorization": f"Bearer {KEYS[tenant]}"}
            body = {"model": "work", "messages": [{"role": "user", "content": "hi"}]}
            while time.monotonic() < deadline:
                url = gateway + "/v1/chat/completions"
                async with session.post(url, json=body, headers=headers) as response:
                    payload = json.loads(await response.read())
                    code = payload.get("error", {}).get("code")
                    retry_after = response.headers.get("retry-after")
                    results.append((tenant, response.status, code, retry_after))
                if response.status == 503:
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(client("fg") for _ in range(6)), *(client("bg") for _ in range(12)))
    return results


def queue_time_p99(metrics_text: str, priority: str) -> float:
    """The upper bound of the histogram bucket holding the 99th percentile."""
    buckets: list[tuple[float, float]] = []
    for line in metrics_text.splitlines():
        match = re.match(r"^sluicegate_queue_time_seconds_bucket\{(.*)\} (\S+)$", line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if labels.get("priority") == priority and labels.get("outcome") == "admitted":
            buckets.append((float(labels["le"]), float(match.group(2))))
    buckets.sort()
    total = buckets[-1][1]
    assert total > 0
    return next(bound for bound, count in buckets if count >= 0.99 * total)


def test_interactive_is_never_shed_and_batch_is_shed_with_retry_after(stack: Stack) -> None:
    results = asyncio.run(overload(stack.gateway))
    interactive = [r for r in results if r[0] == "fg"]
    batch = [r for r in results if r[0] == "bg"]
    assert interactive and batch
    assert {status for _, status, _, _ in interactive} == {200}
    shed = [r for r in batch if r[1] == 503]
    assert shed, "batch was never shed under overload"
    for _, _, code, retry_after in shed:
        assert code in ("queue_full", "queue_timeout", "queue_displaced")
        assert retry_after is not None and int(retry_after) >= 1
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    assert queue_time_p99(text, "interactive") <= INTERACTIVE_MAX_WAIT_S
    # The provider never saw more than the gate allows.
    base = stack.doc["providers"][0]["base_url"].rsplit("/v1", 1)[0]
    with urllib.request.urlopen(base + "/mock/stats", timeout=5) as response:
        assert json.load(response)["max_in_flight"] <= 4
