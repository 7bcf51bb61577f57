"""A concurrency gate is the route's total across ext_proc replicas: each replica
enforces its share, and Envoy spreads requests over the replicas round robin. Two
replicas, a gate of 2, eight concurrent slow requests: the provider never
sees more than 2 at once, and every request is served (the rest queue, none is shed).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.stack import own_addresses, running_stack
from tests.ports import free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GATE = 2
REQUESTS = 8


def document() -> dict[str, Any]:
    listen, alpha, replica = free_ports(3)
    return {
        "version": 1,
        "sluicegate": own_addresses(ext_proc_replicas=[f"127.0.0.1:{replica}"]),
        "admission": {
            "priority_classes": [{"name": "interactive", "max_queue": 16, "max_wait": "20s"}],
            "default_priority": "interactive",
        },
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "providers": [
            {
                "name": "alpha",
                "base_url": f"http://127.0.0.1:{alpha}/v1",
                "mock": {"models": [], "ttft_ms": 400, "itl_ms": 0, "output_tokens": 4},
            }
        ],
        "routes": [
            {
                "name": "chat",
                "models": ["chat"],
                "backends": [{"provider": "alpha"}],
                "concurrency": {"max_requests": GATE},
            }
        ],
    }


async def burst(gateway: str) -> list[int]:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(gateway + "/v1/chat/completions", json=body) as response:
                await response.read()
                return response.status

        return list(await asyncio.gather(*(one() for _ in range(REQUESTS))))


def test_two_replicas_together_hold_a_gate_of_two(tmp_path: Path) -> None:
    doc = document()
    with running_stack(tmp_path, doc) as stack:
        assert asyncio.run(burst(stack.gateway)) == [200] * REQUESTS
        alpha = doc["providers"][0]["base_url"].rsplit("/v1", 1)[0]
        with urllib.request.urlopen(alpha + "/mock/stats", timeout=5) as response:
            stats = json.load(response)
        # Each replica lets 1 through at a time, both together 2; a gate of 2 in each
        # process (the total not shared) would have let 4.
        assert stats["max_in_flight"] == GATE
