"""A `sluicegate up` config, and traffic for it, that make every metric family sluicegate
exposes appear on up's /metrics: tenants with limits, two scenarios, a stream, a retry, a
shed at a gate, and a Redis limiter store that is down (nothing listens on its port).

Route `chat` routes by latency (`routing: latency`) where the config accepts `routing`
(issue 10, part 2, not yet committed when this was written): then the providers'
smoothed figures have samples too. Their names are checked either way.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from sluicegate.config import hash_key
from sluicegate.config.schema import Route
from tests.ports import free_port, free_ports

CLIENT_KEY: Final = "sk-deploy-metrics-test"
HELLO: Final = [{"role": "user", "content": "hello"}]
# A gated request holds the route's one slot this long, so the requests after it queue.
HOLD_MS: Final = 1500


def metrics_stack_config(tmp: Path) -> dict[str, Any]:
    """The document, every port free; Envoy's admin on a Unix socket in `tmp`, as the
    Kubernetes manifests have it."""
    xds, ext_proc, http, listener, alpha, beta = free_ports(6)
    mock = {"models": [], "ttft_ms": 20, "itl_ms": 5, "output_tokens": 8}
    chat: dict[str, Any] = {
        "name": "chat",
        "models": ["chat-model"],
        "scenario": "chat",
        "retries": {"max_retries": 1},
        "backends": [{"provider": "alpha", "weight": 3}, {"provider": "beta", "weight": 1}],
    }
    if "routing" in Route.model_fields:
        chat["routing"] = "latency"
    return {
        "version": 1,
        "sluicegate": {
            "xds": f"127.0.0.1:{xds}",
            "ext_proc": f"127.0.0.1:{ext_proc}",
            "http": f"127.0.0.1:{http}",
            "envoy_admin": f"unix:{tmp / 'admin.sock'}",
        },
        "limits": {"ext_proc_message_timeout_ms": 5000},
        "admission": {
            "priority_classes": [{"name": "interactive", "max_queue": 1, "max_wait": "10s"}],
            "default_priority": "interactive",
            "store": {
                "kind": "redis",
                "url": f"redis://127.0.0.1:{free_port()}/0",
                "on_failure": "local",
            },
        },
        "tenants": [
            {
                "name": "team",
                "rate_limits": {"requests": 100000, "tokens": 100000000, "per": "1m"},
                "keys": [{"name": "team-key", "hash": hash_key(CLIENT_KEY)}],
            }
        ],
        "scenarios": ["chat", "long-generation"],
        "listeners": [
            {"name": "gateway", "address": "127.0.0.1", "port": listener, "role": "gateway"}
        ],
        "providers": [
            {"name": "alpha", "base_url": f"http://127.0.0.1:{alpha}/v1", "mock": mock},
            {"name": "beta", "base_url": f"http://127.0.0.1:{beta}/v1", "mock": mock},
        ],
        "routes": [
            chat,
            {
                "name": "gated",
                "models": ["gated-model"],
                "scenario": "long-generation",
                "concurrency": {"max_requests": 1},
                "backends": [{"provider": "alpha"}],
            },
        ],
    }


def post(gateway: str, body: dict[str, Any], **headers: str) -> tuple[int, bytes]:
    """(status, body) of a chat completion through the gateway (a stream read to its end)."""
    request = urllib.request.Request(
        gateway + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {CLIENT_KEY}",
            **headers,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def send_traffic(gateway: str) -> None:
    """A JSON answer and a stream on each scenario, a request every provider fails (one
    retry), a refused key, and a burst at the gated route until one is shed."""
    for model in ("chat-model", "gated-model"):
        assert post(gateway, {"model": model, "messages": HELLO})[0] == 200
        assert post(gateway, {"model": model, "messages": HELLO, "stream": True})[0] == 200
    status, _ = post(gateway, {"model": "chat-model", "messages": HELLO}, **{"x-mock-fault": "503"})
    assert status == 503
    request = urllib.request.Request(gateway + "/v1/models", headers={"authorization": "Bearer x"})
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as err:
        assert err.code == 401
    assert _shed_one(gateway), "no request was shed at the gated route"


def _shed_one(gateway: str) -> bool:
    """Four requests at once at a gate of one slot and a queue of one: one holds the slot
    for HOLD_MS, one waits, the others are refused (503 queue_full). Tried up to 3 times,
    in case the machine is too slow to send them within HOLD_MS."""
    body = {"model": "gated-model", "messages": HELLO}
    slow = {"x-mock-ttft-ms": str(HOLD_MS)}
    for _ in range(3):
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: post(gateway, body, **slow), range(4)))
        if any(status == 503 and b"queue_full" in text for status, text in answers):
            return True
    return False
