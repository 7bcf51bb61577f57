"""What the routing stage tells the request record, as a real Envoy 1.40 logs it (issue 10).

The gateway is the translator's own resources (what ADS pushes) inlined into a static
bootstrap, in front of an echo provider, with the real ext_proc server. One thing is
added for the test: a gRPC access log on the listener sending every request's entry to
a collector here, as the record channel will. Each request's entry must carry, in the
`sluicegate` namespace of its dynamic metadata, what the routing stage knew: so Envoy
keeps metadata returned with an immediate response (a refusal) as well as with a routed
answer, and the ext_proc filter may write the namespace.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from sluicegate import wire
from sluicegate.filters import ExtProcServer
from sluicegate.model import build_model
from tests.filters.admission_helpers import hashed
from tests.ports import free_port
from tests.translate.cases import config_of
from tests.translate.envoy_harness import running_envoy, static_bootstrap

from .access_log_collector import RECORD_ID, Collector, serve_collector, with_access_log

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

KEY = "sk-record-e2e-0001"


@dataclass
class Gateway:
    url: str
    collector: Collector
    seen: list[dict[str, str]]  # each request's headers, as the provider got them


def document(listen_port: int, provider_port: int, *, tenants: bool) -> str:
    # The routing stage writes the record's metadata (without tenants the default lane
    # would be Envoy's routing alone).
    text = f"""
version: 1
admission: {{lane: exact}}
listeners: [{{name: main, port: {listen_port}}}]
providers:
  - {{name: echo, base_url: "http://127.0.0.1:{provider_port}/v1"}}
scenarios: [chat, long-generation]
routes:
  - {{name: chat, models: [m], scenario: chat, backends: [{{provider: echo}}]}}
  - {{name: second, models: [o], backends: [{{provider: echo}}]}}
"""
    if tenants:
        text += f"""
tenants:
  - name: team
    rate_limits: {{requests: 3, per: 1m}}
    keys: [{{name: team-key, hash: "{hashed(KEY)}"}}]
"""
    return text


async def _gateway(tmp: Any, *, tenants: bool) -> AsyncIterator[Gateway]:
    seen: list[dict[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        return web.json_response({"object": "chat.completion", "choices": [], "usage": usage})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    provider_port, listen_port, ext_proc_port, collector_port = (free_port() for _ in range(4))
    await web.TCPSite(runner, "127.0.0.1", provider_port).start()
    collector = Collector()
    collector_server = await serve_collector(collector, collector_port)
    model = build_model(config_of(document(listen_port, provider_port, tenants=tenants)), {})
    ext_proc = ExtProcServer()
    ext_proc.load(model)
    await ext_proc.start(f"127.0.0.1:{ext_proc_port}")
    from sluicegate.xds.translate import translate

    bootstrap = with_access_log(
        static_bootstrap(translate(model), ext_proc_port=ext_proc_port), collector_port
    )
    try:
        async with running_envoy(bootstrap, tmp):
            yield Gateway(f"http://127.0.0.1:{listen_port}", collector, seen)
    finally:
        await ext_proc.stop(0)
        await collector_server.stop(0)
        await runner.cleanup()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    async for item in _gateway(tmp_path_factory.mktemp("record"), tenants=True):
        yield item


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def open_gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    async for item in _gateway(tmp_path_factory.mktemp("record-open"), tenants=False):
        yield item


async def call(
    gateway: Gateway,
    body: bytes | None,
    headers: Sequence[tuple[str, str]] = (),
    path: str = "/v1/chat/completions",
) -> tuple[int, dict[str, Any]]:
    """(status, the request's access-log entry)."""
    request_id = f"record-{time.monotonic_ns()}"
    sent = {RECORD_ID: request_id, "content-type": "application/json", **dict(headers)}
    method = "GET" if body is None else "POST"
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, gateway.url + path, data=body, headers=sent) as response,
    ):
        await response.read()
        status = response.status
    entry = await gateway.collector.entry(request_id)
    return status, {
        "status": entry.status,
        "details": entry.details,
        **entry.metadata.get(wire.METADATA_NAMESPACE, {}),
    }


def chat(model: str, **extra: Any) -> bytes:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    ).encode()


BEARER = ("authorization", f"Bearer {KEY}")


async def test_an_admitted_request_is_recorded(gateway: Gateway) -> None:
    gateway.seen.clear()
    status, entry = await call(
        gateway, chat("m", stream=True), [BEARER, (wire.SCENARIO_HEADER, "long-generation")]
    )
    assert status == 200
    assert entry["tenant"] == "team"
    assert entry["key_name"] == "team-key"
    assert (entry["model"], entry["priority"]) == ("m", "standard")
    assert (entry["scenario"], entry["stream"]) == ("long-generation", "true")
    assert entry["queue_ms"] == 0
    assert "error_code" not in entry
    assert KEY not in json.dumps(entry)
    # The scenario header only labels the request: no provider sees it.
    assert [wire.SCENARIO_HEADER in headers for headers in gateway.seen] == [False]


@pytest.mark.parametrize(
    ("body", "headers", "status", "expected"),
    [
        (chat("m"), [], 401,
         {"tenant": "anonymous", "error_code": "missing_api_key", "scenario": ""}),
        (b"{", [BEARER], 400,
         {"tenant": "team", "key_name": "team-key", "error_code": "invalid_json"}),
        (chat("nope"), [BEARER], 404,
         {"model": "nope", "error_code": "model_not_found", "scenario": ""}),
    ],
)  # fmt: skip
async def test_a_refusal_is_recorded_with_its_error_code(
    gateway: Gateway,
    body: bytes,
    headers: list[tuple[str, str]],
    status: int,
    expected: dict[str, Any],
) -> None:
    got, entry = await call(gateway, body, headers)
    assert got == status
    assert entry["details"].startswith("sluicegate_")  # the filter's own answer
    assert {key: entry.get(key) for key in expected} == expected
    assert entry["queue_ms"] == 0


async def test_a_rate_limited_request_is_recorded(gateway: Gateway) -> None:
    statuses = []
    entry: dict[str, Any] = {}
    for _ in range(4):  # the tenant may make 3 a minute, the other tests' included
        status, entry = await call(gateway, chat("o"), [BEARER])
        statuses.append(status)
        if status == 429:
            break
    assert statuses[-1] == 429
    assert entry["error_code"] == "rate_limit_exceeded"
    assert (entry["tenant"], entry["key_name"], entry["model"]) == ("team", "team-key", "o")
    assert (entry["priority"], entry["scenario"]) == ("standard", "default")


async def test_a_bodiless_request_is_recorded(gateway: Gateway) -> None:
    status, entry = await call(gateway, None, [BEARER], path="/v1/models")
    assert status == 200
    assert (entry["tenant"], entry["scenario"], entry["stream"]) == ("team", "", "false")


async def test_without_admission_a_request_is_recorded_too(open_gateway: Gateway) -> None:
    """Needs the translator to let the routing stage write the namespace with admission
    off too (xds/translate/listeners.py, metadata_namespaces): Envoy drops it otherwise."""
    status, entry = await call(open_gateway, chat("m"), [(wire.SCENARIO_HEADER, "nope")])
    assert status == 200
    assert (entry["tenant"], entry["scenario"], entry["priority"]) == (
        "anonymous",
        "chat",
        "standard",
    )
    assert (entry["model"], entry["stream"], entry["queue_ms"]) == ("m", "false", 0)
    assert "key_name" not in entry
    status, entry = await call(open_gateway, chat("unknown"))
    assert status == 404
    assert (entry["error_code"], entry["scenario"]) == ("model_not_found", "")
