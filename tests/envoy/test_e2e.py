"""End to end: real Envoy, both ext_proc stages on a real ExtProcServer, echo providers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sluicegate import wire
from sluicegate.envoy import EnvoyProcess
from sluicegate.filters import ExtProcServer, RouteInfo, RoutingTable

from .static_gateway import Provider, Route, static_gateway

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@dataclass
class EchoProvider:
    """Records every request it gets; fails with 503 when `x-test-fail` names it."""

    name: str
    seen: list[dict[str, Any]] = field(default_factory=list)
    runner: web.AppRunner | None = None
    port: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        record = {
            "provider": self.name,
            "path": request.path_qs,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": body.decode("utf-8"),
        }
        self.seen.append(record)
        if request.headers.get("x-test-fail") == self.name:
            return web.json_response({"error": "injected"}, status=503)
        return web.json_response(record)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@dataclass
class Gateway:
    url: str
    session: aiohttp.ClientSession
    providers: dict[str, EchoProvider]
    ext_proc: ExtProcServer
    envoy: EnvoyProcess

    async def post(self, path: str, body: bytes, **headers: str) -> tuple[int, Any, Any]:
        async with self.session.post(self.url + path, data=body, headers=headers) as response:
            return response.status, response.headers, await response.json(content_type=None)


@pytest.fixture
async def gateway(tmp_path: Any) -> AsyncIterator[Gateway]:
    providers = {name: EchoProvider(name) for name in ("a", "b", "c")}
    ext_proc = ExtProcServer(
        RoutingTable(
            {
                "m1": RouteInfo("r1"),
                "m2": RouteInfo("r2"),
                "модель-2": RouteInfo("r2"),
            }
        )
    )
    envoy: EnvoyProcess | None = None
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
    try:
        for provider in providers.values():
            await provider.start()
        address = await ext_proc.start("127.0.0.1:0")
        routes = [
            Route(
                "r1",
                ["m1"],
                [
                    Provider("a", providers["a"].port, 0, "/pa/v1", {"m1": "provider-a-m1"}),
                    Provider("b", providers["b"].port, 1, "/pb"),
                ],
            ),
            Route("r2", ["m2", "модель-2"], [Provider("c", providers["c"].port)]),
        ]
        config = static_gateway(int(address.rsplit(":", 1)[1]), routes)
        envoy = EnvoyProcess(config, work_dir=tmp_path / "envoy", concurrency=1)
        await envoy.start(timeout=20)
        host, port = envoy.listeners()["gateway"]
        yield Gateway(f"http://{host}:{port}", session, providers, ext_proc, envoy)
    finally:
        await session.close()
        if envoy is not None:
            await envoy.stop()
        await ext_proc.stop(0)
        for provider in providers.values():
            await provider.stop()


def assert_openai_error(status: int, headers: Any, document: Any, expected: int, code: str):
    assert status == expected, document
    assert headers["content-type"] == "application/json"
    assert set(document["error"]) == {"message", "type", "param", "code"}
    assert document["error"]["code"] == code


async def test_gateway_routes_rewrites_and_rejects(gateway: Gateway):
    a, b, c = (gateway.providers[name] for name in ("a", "b", "c"))
    body = b'{"model":"m1",  "messages":[{"role":"user","content":"h\\u00e9"}],"temperature":0.50}'

    # Routed by the body's model to route r1, primary provider a: model mapped, path
    # re-rooted, every other byte kept, content-length right.
    status, _, echo = await gateway.post("/v1/chat/completions?api-version=2", body)
    assert status == 200, echo
    expected = body.replace(b'"m1"', b'"provider-a-m1"')
    assert echo["provider"] == "a"
    assert echo["path"] == "/pa/v1/chat/completions?api-version=2"
    assert echo["body"].encode() == expected
    assert echo["headers"]["content-length"] == str(len(expected))
    assert echo["headers"][wire.PROVIDER_HEADER] == "a"
    assert echo["headers"][wire.MODEL_HEADER] == "m1"

    # Another model, another route and cluster; provider c has no map and no prefix.
    m2 = b'{"model": "m2", "stream": false}'
    status, _, echo = await gateway.post("/v1/embeddings", m2)
    assert (status, echo["provider"], echo["path"]) == (200, "c", "/v1/embeddings")
    assert echo["body"].encode() == m2
    status, _, echo = await gateway.post("/v1/chat/completions", '{"model":"модель-2"}'.encode())
    assert (status, echo["provider"]) == (200, "c")

    # Retry: a fails, Envoy retries on b (priority 1). b has no model map and its own
    # prefix; the shared header map still had a's path and length.
    status, _, echo = await gateway.post("/v1/chat/completions", body, **{"x-test-fail": "a"})
    assert status == 200, echo
    assert echo["provider"] == "b"
    assert echo["path"] == "/pb/chat/completions"
    assert echo["body"].encode() == body
    assert echo["headers"]["content-length"] == str(len(body))
    assert a.seen[-1]["path"] == "/pa/v1/chat/completions"

    # Client errors, in OpenAI's format, never reaching a provider.
    calls = len(a.seen) + len(b.seen) + len(c.seen)
    assert_openai_error(
        *await gateway.post("/v1/chat/completions", b'{"model": "gpt-9"}'), 404, "model_not_found"
    )
    assert_openai_error(*await gateway.post("/v1/chat/completions", b"{oops"), 400, "invalid_json")
    assert_openai_error(
        *await gateway.post("/v1/chat/completions", b'{"model": 7}'), 400, "invalid_type"
    )
    assert_openai_error(
        *await gateway.post("/v1/chat/completions", b'{"messages": []}'), 400, "missing_model"
    )
    # A bodiless request cannot pick a model route by sending the header itself.
    async with gateway.session.get(
        gateway.url + "/v1/chat/completions", headers={wire.MODEL_HEADER: "m1"}
    ) as response:
        assert response.status == 404
        assert json.loads(await response.read())["error"]["code"] == "no_route"
    assert len(a.seen) + len(b.seen) + len(c.seen) == calls

    counts = gateway.ext_proc.counters.snapshot()
    assert counts[wire.STAGE_ROUTING]["routed"] == 4
    assert counts[wire.STAGE_ROUTING]["model_not_found"] == 1
    assert counts[wire.STAGE_ROUTING]["bad_request"] == 3
    assert counts[wire.STAGE_ATTEMPT]["rewritten"] == 2  # first request, and a's failed try
    stats = gateway.envoy.stats()
    assert stats["cluster.llm_r1.upstream_rq_retry"] == 1
