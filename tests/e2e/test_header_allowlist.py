"""What a provider receives (issue 9, part 2), through `sluicegate up` and a real Envoy.

Two recording providers (plain HTTP servers on 127.0.0.1 that keep every request's
method, path and raw headers) stand behind the gateway. One request carries every
hostile header a client could send: its key in Cookie, Proxy-Authorization,
x-goog-api-key, anthropic-api-key and the query string; OpenAI-Organization and
OpenAI-Project of its choosing; forged X-Forwarded-For, X-Real-IP, Forwarded and
X-Forwarded-Host; sluicegate's and Envoy's internal headers; a 20 KB header. Each test
asserts the exact set of header names the provider received, and the values that
matter.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.request import Request, urlopen

import pytest

from sluicegate import wire
from tests.e2e.stack import own_addresses, running_stack
from tests.ports import free_ports

pytestmark = pytest.mark.e2e

CLIENT_KEY = "sk-sluicegate-demo"  # quickstart's demo tenant key
DEMO_HASH = (
    "sha256:4993ac97c21f7374edfa92a4187fba10:"
    "2f8bdf1a9b5bebf88ce01a2294d957b35dc6f1638a8989e2d54c00d4caeb3ff2"
)
PROVIDER_KEY = "sk-provider-a-51c0ffee"

# Every header a client may send that a provider must not see, and what it tries.
HOSTILE = {
    wire.SCENARIO_HEADER: "long-generation",
    "cookie": f"session={CLIENT_KEY}",
    "proxy-authorization": f"Bearer {CLIENT_KEY}",
    "x-goog-api-key": CLIENT_KEY,
    "anthropic-api-key": CLIENT_KEY,
    "x-api-key": CLIENT_KEY,
    "openai-organization": "org-chosen-by-client",
    "openai-project": "proj_chosen_by_client",
    "x-forwarded-for": "203.0.113.66",
    "x-real-ip": "203.0.113.66",
    "forwarded": "for=203.0.113.66;host=evil.example",
    "x-forwarded-host": "evil.example",
    "x-sluicegate-model": "something-else",
    "x-sluicegate-provider": "b",
    "x-sluicegate-priority": "interactive",
    "x-envoy-original-host": "evil.example",
    "x-stainless-os": "Linux",
    "x-big": "a" * 20_000,
}
# What an OpenAI-compatible API needs, which every provider receives as sent.
ALLOWED = {
    "accept": "application/json",
    "user-agent": "allowlist-test/1.0",
    "openai-beta": "assistants=v2",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=opaque",
    "x-stainless-lang": "python",  # only provider `a` lists it in forward_headers
}
# Credentials in every spelling; the rest kept byte for byte (`%26api_key%3D…` is one
# parameter's value, not a parameter: it must not become one).
QUERY = (
    "?api_key=sk-in-url&key=sk-in-url&access_token=sk-in-url&limit=5&api%5Fkey=sk-in-url"
    "&API-Key=sk-in-url&q=a%26api_key%3Dsk-in-url&flag"
)
KEPT_QUERY = "?limit=5&q=a%26api_key%3Dsk-in-url&flag"
# Set by Envoy or sluicegate for every request (Host from the endpoint).
ALWAYS = {"host", "content-type", "content-length", "x-request-id"}


@dataclass
class Recorder:
    """A provider that answers every POST with a chat completion and keeps what it got."""

    port: int
    requests: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200  # what it answers (503: a provider failing, retried on the next)

    def serve(self) -> ThreadingHTTPServer:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                headers = [(key.lower(), value) for key, value in self.headers.items()]
                recorder.requests.append({"path": self.path, "headers": headers, "body": body})
                answer = json.dumps(
                    {
                        "id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                        "model": json.loads(body)["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "ok"}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()  # fmt: skip
                self.send_response(recorder.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


@dataclass
class Setup:
    gateway: str
    a: Recorder
    b: Recorder


def document(a: Recorder, b: Recorder, *, extras: bool, fast: str | None = None) -> dict[str, Any]:
    """Provider `a` (keyed) serves model `one` alone; model `two` goes to `b` first, with
    `a` as its fallback, so its route's providers differ in what they receive when
    `extras` gives `a` fixed headers and a longer list. With `fast` (the native filters'
    `module`), the tenant is in the fast lane: Envoy decides its requests, the routing
    stage sees none (its key's secret is the file demo.client)."""
    provider_a: dict[str, Any] = {
        "name": "a",
        "base_url": f"http://127.0.0.1:{a.port}/v1",
        "api_key": {"file": "a.key"},
    }
    if extras:
        provider_a["headers"] = {"OpenAI-Organization": "org-gateway", "OpenAI-Project": "proj_gw"}
        provider_a["forward_headers"] = ["X-Stainless-Lang"]
    listen = free_ports(1)[0]
    tenant: dict[str, Any] = {
        "name": "demo",
        "priority": "interactive",
        "keys": [{"name": "demo", "hash": DEMO_HASH}],
    }
    if fast is not None:
        tenant["lane"] = "fast"
        tenant["keys"][0]["secret"] = {"file": "demo.client"}
    return {
        "version": 1,
        "sluicegate": own_addresses(),
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "native_filters": {"module": fast or "node"},
        "providers": [provider_a, {"name": "b", "base_url": f"http://127.0.0.1:{b.port}/v1"}],
        "routes": [
            {"name": "one", "models": ["one"], "backends": [{"provider": "a"}]},
            {
                "name": "two",
                "models": ["two"],
                "backends": [{"provider": "b"}, {"provider": "a", "priority": 1}],
            },
        ],
        "tenants": [tenant],
    }


# (extras, fast): the exact lane with and without provider extras; the fast lane, with
# Envoy's filters and with the native library's.
SETUPS: Final = {
    "defaults": (False, None),
    "provider-extras": (True, None),
    "fast-lane": (True, "off"),
    "fast-lane-native": (True, "node"),
}


@pytest.fixture(scope="module", params=list(SETUPS))
def setup(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    extras, fast = SETUPS[request.param]
    tmp = tmp_path_factory.mktemp("allowlist")
    (tmp / "a.key").write_text(PROVIDER_KEY + "\n")
    (tmp / "demo.client").write_text(CLIENT_KEY)
    a, b = (Recorder(port) for port in free_ports(2))
    servers = [a.serve(), b.serve()]
    try:
        doc = document(a, b, extras=extras, fast=fast)
        with running_stack(tmp, doc) as stack:
            if fast == "node":  # `up` built the library and its Envoy loaded it
                (node,) = stack.status()["nodes"]
                assert node["class"], node
            yield Setup(stack.gateway, a, b)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def send(setup: Setup, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {
        "authorization": f"Bearer {CLIENT_KEY}",
        "content-type": "application/json",
        **HOSTILE,
        **ALLOWED,
    }
    request = Request(setup.gateway + "/v1/chat/completions" + QUERY, data=body, headers=headers)
    with urlopen(request, timeout=30) as response:
        assert response.status == 200
        result: dict[str, Any] = json.load(response)
        return result


def received(recorder: Recorder) -> tuple[str, dict[str, str]]:
    assert len(recorder.requests) == 1, recorder.requests
    request = recorder.requests.pop()
    names = [name for name, _ in request["headers"]]
    assert len(names) == len(set(names)), f"a header arrived twice: {names}"
    return request["path"], dict(request["headers"])


def test_a_keyed_provider_receives_the_allowlist_and_its_key(setup: Setup) -> None:
    send(setup, "one")
    path, headers = received(setup.a)
    extras = "openai-organization" in headers
    expected = ALWAYS | set(ALLOWED) - {"x-stainless-lang"} | {"authorization"}
    if extras:
        expected |= {"x-stainless-lang", "openai-organization", "openai-project"}
    assert set(headers) == expected
    assert headers["authorization"] == f"Bearer {PROVIDER_KEY}"
    assert path == "/v1/chat/completions" + KEPT_QUERY
    for name in ALLOWED.keys() & expected:
        assert headers[name] == ALLOWED[name], name
    if extras:  # the gateway's organization and project, never the client's
        assert headers["openai-organization"] == "org-gateway"
        assert headers["openai-project"] == "proj_gw"
    assert CLIENT_KEY not in json.dumps(headers) + path


def test_each_provider_of_a_route_receives_its_own_list(setup: Setup) -> None:
    """Route `two` holds both providers: `b` (keyless, nothing extra) answers."""
    send(setup, "two")
    path, headers = received(setup.b)
    assert set(headers) == ALWAYS | set(ALLOWED) - {"x-stainless-lang"}
    assert path == "/v1/chat/completions" + KEPT_QUERY
    assert CLIENT_KEY not in json.dumps(headers) + path


@pytest.mark.parametrize("module", ["off", "node"], ids=["header_mutation", "native"])
def test_a_retry_carries_no_header_of_the_first_provider(tmp_path: Path, module: str) -> None:
    """Envoy's upstream filters change the one request every attempt starts from: the
    fixed headers of `a`, which fails (503), must not reach `b`, retried next, though
    `b`'s list names them (b sets none of its own: it gets neither a's nor the
    client's). With Envoy's filters and the native library's (docs/architecture.md,
    "What a provider receives")."""
    a, b = Recorder(free_ports(1)[0], status=503), Recorder(free_ports(1)[0])
    servers = [a.serve(), b.serve()]
    doc = {
        "version": 1,
        "sluicegate": own_addresses(),
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": free_ports(1)[0]}],
        "native_filters": {"module": module},
        "providers": [
            {"name": "a", "base_url": f"http://127.0.0.1:{a.port}/v1",
             "headers": {"User-Agent": "gateway-a/1", "OpenAI-Organization": "org-a"}},
            {"name": "b", "base_url": f"http://127.0.0.1:{b.port}/v1",
             "forward_headers": ["OpenAI-Organization"]},
        ],
        "routes": [{"name": "r", "models": ["m"],
                    "backends": [{"provider": "a"}, {"provider": "b", "priority": 1}]}],
    }  # fmt: skip
    try:
        with running_stack(tmp_path, doc) as stack:
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            headers = {"content-type": "application/json", "user-agent": "client/1",
                       "openai-organization": "org-client", "x-stainless-os": "Linux"}  # fmt: skip
            request = Request(stack.gateway + "/v1/chat/completions", data=body.encode(),
                              headers=headers)  # fmt: skip
            with urlopen(request, timeout=30) as response:
                assert response.status == 200
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    [first] = [dict(r["headers"]) for r in a.requests]
    [retried] = [dict(r["headers"]) for r in b.requests]
    assert (first["user-agent"], first["openai-organization"]) == ("gateway-a/1", "org-a")
    assert "user-agent" not in retried and "openai-organization" not in retried, retried
