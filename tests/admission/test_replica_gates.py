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
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.config import hash_key
from tests.e2e.stack import Stack, own_addresses, running_stack
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


KEY = "sk-test-spread-0123456789abcdef"
SEQUENTIAL = 6


def admitted(stack: Stack) -> float:
    """Admitted requests on up's /metrics: every ext_proc server's samples (labelled)."""
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sluicegate_admission_decisions_total"
        and sample.labels.get("outcome") == "admitted"
    )


def routing_streams_per_server(stack: Stack) -> list[int]:
    """Routing streams Envoy opened to each ext_proc server (admin /clusters)."""
    with urllib.request.urlopen(stack.admin + "/clusters?format=json", timeout=5) as response:
        clusters = json.load(response)["cluster_statuses"]
    routing = next(c for c in clusters if c["name"] == "sluicegate_ext_proc")
    return sorted(
        next((int(s.get("value", 0)) for s in host["stats"] if s["name"] == "rq_total"), 0)
        for host in routing["host_statuses"]
    )


def test_requests_one_at_a_time_take_turns_across_replicas(tmp_path: Path) -> None:
    """Other ext_proc traffic (request records, the usage observer, the attempt stage) goes
    to a cluster of its own, so round robin over the routing streams alternates replicas
    request by request; each replica's gate share then sees half. up's /metrics shows
    every server's counts, each labelled by its server."""
    doc = document()
    doc["tenants"] = [
        {
            "name": "spread",
            "rate_limits": {"tokens": 1_000_000, "per": "1m"},
            "keys": [{"name": "spread-key", "hash": hash_key(KEY)}],
        }
    ]
    body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    headers["x-mock-ttft-ms"] = "0"
    with running_stack(tmp_path, doc) as stack:
        before, streams_before = admitted(stack), routing_streams_per_server(stack)
        for _ in range(SEQUENTIAL):
            request = urllib.request.Request(
                stack.gateway + "/v1/chat/completions", body.encode(), headers, method="POST"
            )
            with urllib.request.urlopen(request, timeout=20) as response:
                assert response.status == 200
        streams = routing_streams_per_server(stack)
        # Sharing one cluster, routing and observer streams alternated: every routing
        # stream went to the same process (0 and 6 here).
        assert [a - b for a, b in zip(streams, streams_before, strict=True)] == [
            SEQUENTIAL // 2
        ] * 2
        assert admitted(stack) - before == SEQUENTIAL
