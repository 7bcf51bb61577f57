"""A gateway (`sluicegate up`, real Envoy) in front of mock providers run by the test.

The mocks run in this process (sluicegate.provider.thread), so tests read their counters
and change their behaviour directly; `up` starts none of them (no `mock:` sections). Each
test module builds one document with a route per scenario, each route overriding the
`defaults:` it needs, and starts one stack for all of them.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai import OpenAI

from sluicegate.provider import make_test_ca as make_provider_test_ca
from sluicegate.provider.settings import MockProviderSettings
from sluicegate.provider.thread import ThreadedMockProvider, start_mock_provider_thread
from tests.e2e.stack import Stack, running_stack
from tests.ports import free_port

CLIENT_KEY = "sk-sluicegate-test"
HELLO: Any = [{"role": "user", "content": "hello"}]


def mock(name: str, **settings: Any) -> ThreadedMockProvider:
    """A fast mock provider (tests slow it per request with x-mock-* headers)."""
    defaults: dict[str, Any] = {"ttft_ms": 5.0, "itl_ms": 2.0, "output_tokens": 4}
    return start_mock_provider_thread(MockProviderSettings(name=name, **{**defaults, **settings}))


def document(
    providers: list[dict[str, Any]],
    routes: list[dict[str, Any]],
    defaults: dict[str, Any] | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 1,
        "sluicegate": {
            key: f"127.0.0.1:{free_port()}" for key in ("xds", "ext_proc", "http", "envoy_admin")
        },
        "listeners": [{"name": "gateway", "address": "127.0.0.1", "port": free_port()}],
        # These mocks are plain processes, not `mock:` providers: let their knobs through.
        "providers": [{**p, "forward_headers": ["x-mock-*"]} for p in providers],
        "routes": routes,
    }
    if defaults is not None:
        doc["defaults"] = defaults
    return doc


@contextmanager
def gateway(tmp: Path, doc: dict[str, Any]) -> Iterator[Stack]:
    with running_stack(tmp, doc) as stack:
        yield stack


def client(stack: Stack, timeout: float = 30.0) -> OpenAI:
    """The official SDK, with its own retries off: every retry seen is Envoy's."""
    return OpenAI(
        base_url=stack.gateway + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=timeout
    )


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]
    seconds: float


def post(
    stack: Stack, model: str, headers: dict[str, str] | None = None, timeout: float = 30.0
) -> Answer:
    """A non-streamed chat completion with raw status, JSON body and headers."""
    body = json.dumps({"model": model, "messages": HELLO}).encode()
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions",
        data=body,
        method="POST",
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {CLIENT_KEY}",
            **(headers or {}),
        },
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw, got = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as err:
        status, raw, got = err.code, err.read(), dict(err.headers)
    elapsed = time.monotonic() - started
    return Answer(status, json.loads(raw), {k.lower(): v for k, v in got.items()}, elapsed)


def post_stream(stack: Stack, model: str, timeout: float = 30.0) -> bytes:
    """A streamed chat completion, read to the end of the HTTP body."""
    body = json.dumps({"model": model, "messages": HELLO, "stream": True}).encode()
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions",
        data=body,
        method="POST",
        headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        data: bytes = response.read()
        return data


def stats(stack: Stack, cluster: str) -> dict[str, int]:
    """Envoy's counters and gauges for one cluster, names without the cluster prefix."""
    prefix = f"cluster.{cluster}."
    url = f"{stack.admin}/stats?format=json&filter=^{prefix.replace('.', '[.]')}"
    with urllib.request.urlopen(url, timeout=5) as response:
        document_ = json.load(response)
    values: dict[str, int] = {}
    for stat in document_["stats"]:
        if "value" in stat and isinstance(stat["value"], int):
            values[stat["name"].removeprefix(prefix)] = stat["value"]
    return values


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not reached within {timeout_s}s: {what}")


def requests_total(provider: ThreadedMockProvider) -> int:
    count: int = provider.stats()["requests_total"]
    return count


class Blackhole:
    """A TCP port whose accept queue is full: connects to it hang until they time out."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.port: int = self._listener.getsockname()[1]
        # One connection fills a backlog of 0; later SYNs are dropped, so connects hang.
        self._filler = socket.create_connection(("127.0.0.1", self.port), timeout=2)

    def close(self) -> None:
        self._filler.close()
        self._listener.close()


def closed_port() -> int:
    """A port nothing listens on (connection refused)."""
    return free_port()


@contextmanager
def mocks(*names: str, **settings: Any) -> Iterator[dict[str, ThreadedMockProvider]]:
    with ExitStack() as stack:
        running = {}
        for name in names:
            provider = mock(name, **settings)
            stack.callback(provider.close)
            running[name] = provider
        yield running


def make_test_ca(directory: Path, server_name: str) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for `server_name`."""
    certs = make_provider_test_ca(directory, [server_name])
    return certs.ca, certs.cert, certs.key
