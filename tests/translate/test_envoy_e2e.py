"""The translated resources, served by a real Envoy 1.40, behave as the design says.

Envoy runs the resources inlined into a static bootstrap (what ADS would push), in front of
small aiohttp echo upstreams (one over TLS, reached by host name through a DNS cluster)
and the stand-in ext_proc server in fake_ext_proc.py. Covered: OpenAI-format local
replies (404, 413, 500, 503, 504) and pass-through of JSON replies, per-attempt keys
(the client's Authorization never leaks), Host per provider, the attempt-stage rewrite of
path and model, the early removal of a client-sent model header, and ext_proc being
skipped where Python has nothing to do.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from sluicegate import wire
from sluicegate.model import Gateway as ResolvedGateway
from sluicegate.model import build_model
from sluicegate.provider import make_test_ca
from sluicegate.xds.translate import models_list_json, translate
from tests.ports import free_port

from . import fake_ext_proc
from .cases import config_of
from .envoy_harness import running_envoy, static_bootstrap

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

BODY_LIMIT = 4096


@dataclass
class Upstream:
    """An echo server: answers every request with what it received, and records it."""

    name: str
    port: int
    seen: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Gateway:
    url: str
    model: ResolvedGateway
    upstreams: dict[str, Upstream]
    ext_proc: fake_ext_proc.FakeExtProc


async def _start_echo(
    name: str, runners: list[web.AppRunner], ssl_context: ssl.SSLContext | None = None
) -> Upstream:
    upstream = Upstream(name, free_port())

    async def echo(request: web.Request) -> web.Response:
        record = {
            "path": request.path_qs,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": (await request.read()).decode(),
        }
        upstream.seen.append(record)
        return web.json_response({"upstream": name, **record})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", upstream.port, ssl_context=ssl_context).start()
    runners.append(runner)
    return upstream


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    tmp = tmp_path_factory.mktemp("envoy")
    certs = make_test_ca(tmp, ["localhost", "127.0.0.1"])
    cert = certs.ca  # the gateway trusts the CA that signed the upstream's certificate
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(certs.cert, certs.key)
    runners: list[web.AppRunner] = []
    alpha = await _start_echo("alpha", runners)
    beta = await _start_echo("beta", runners)
    secure = await _start_echo("secure", runners, server_tls)
    ext_proc_port, listen_port = free_port(), free_port()
    document = f"""
version: 1
limits: {{max_request_body_bytes: {BODY_LIMIT}, ext_proc_message_timeout_ms: 300}}
admission: {{lane: exact}}   # the routing stage (a fake one) routes every request
listeners:
  - {{name: main, port: {listen_port}}}
providers:
  - {{name: alpha, base_url: "http://127.0.0.1:{alpha.port}/v1", api_key: {{env: A}}}}
  - name: beta
    base_url: http://127.0.0.1:{beta.port}/api/paas/v4/
    model_map: {{m: m-beta}}
  - {{name: dead, base_url: "http://127.0.0.1:{free_port()}/v1"}}
  - name: secure
    base_url: https://localhost:{secure.port}/v1
    api_key: {{env: S}}
    tls: {{ca_file: "{cert}"}}
  - name: impostor
    base_url: https://localhost:{secure.port}/v1
    tls: {{ca_file: "{cert}", sni: other.example}}
routes:
  - {{name: chat, models: [m], backends: [{{provider: alpha}}, {{provider: beta}}]}}
  - name: simple
    models: [s, {fake_ext_proc.LIMITED_MODEL}, {fake_ext_proc.EXPLODING_MODEL},
             {fake_ext_proc.SLOW_MODEL}]
    backends: [{{provider: alpha}}]
  - {{name: gone, models: [dead-model], backends: [{{provider: dead}}]}}
  - {{name: tls, models: [secure-model], backends: [{{provider: secure}}]}}
  - {{name: impostor, models: [impostor-model], backends: [{{provider: impostor}}]}}
"""
    ir = build_model(config_of(document), {"alpha": "sk-alpha", "secure": "sk-secure"})
    server, servicer = await fake_ext_proc.start(ext_proc_port)
    bootstrap = static_bootstrap(translate(ir), ext_proc_port=ext_proc_port)
    try:
        async with running_envoy(bootstrap, tmp):
            upstreams = {u.name: u for u in (alpha, beta, secure)}
            yield Gateway(f"http://127.0.0.1:{listen_port}", ir, upstreams, servicer)
    finally:
        await server.stop(0)
        for runner in runners:
            await runner.cleanup()


async def _call(gateway: Gateway, method: str, path: str, **kwargs: Any) -> tuple[int, str, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, gateway.url + path, **kwargs) as response,
    ):
        return response.status, response.headers.get("content-type", ""), await response.read()


def _openai_error(status: int, content_type: str, body: bytes) -> dict[str, Any]:
    assert content_type == "application/json", (status, content_type, body)
    error = json.loads(body)["error"]
    assert isinstance(error, dict)
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


async def test_models_list_is_answered_by_envoy_without_python(gateway: Gateway) -> None:
    before = len(gateway.ext_proc.seen)
    status, content_type, body = await _call(gateway, "GET", "/v1/models")
    assert (status, content_type) == (200, "application/json")
    assert body == models_list_json(gateway.model)  # not re-wrapped by local_reply_config
    status, _, body = await _call(gateway, "GET", "/v1/models/secure-model")
    assert status == 200
    assert json.loads(body)["id"] == "secure-model"
    assert len(gateway.ext_proc.seen) == before


async def test_unknown_path_is_an_openai_404_without_python(gateway: Gateway) -> None:
    before = len(gateway.ext_proc.seen)
    error = _openai_error(*await _call(gateway, "GET", "/nope?key=secret"))
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "unknown_url"
    assert error["message"] == "Invalid URL (GET /nope)"  # no query string echoed
    assert len(gateway.ext_proc.seen) == before


async def test_providers_get_their_own_key_and_never_the_clients(gateway: Gateway) -> None:
    alpha, beta = gateway.upstreams["alpha"], gateway.upstreams["beta"]
    alpha.seen.clear()
    beta.seen.clear()
    for _ in range(6):
        status, _, _ = await _call(
            gateway, "POST", "/v1/chat/completions?x=1",
            json={"model": "m"}, headers={"authorization": "Bearer client-key"},
        )  # fmt: skip
        assert status == 200
    assert alpha.seen and beta.seen, "equal weights: both providers serve"
    for request in alpha.seen:
        assert request["headers"]["authorization"] == "Bearer sk-alpha"
        # The credential injector matched on it; the allowlist then removed it.
        assert wire.PROVIDER_HEADER not in request["headers"]
        assert request["headers"]["host"] == f"127.0.0.1:{alpha.port}"
    for request in beta.seen:
        assert "authorization" not in request["headers"]
        assert wire.PROVIDER_HEADER not in request["headers"]
        assert request["headers"]["host"] == f"127.0.0.1:{beta.port}"


async def test_attempt_stage_rewrites_path_and_model_per_provider(gateway: Gateway) -> None:
    alpha, beta = gateway.upstreams["alpha"], gateway.upstreams["beta"]
    alpha.seen.clear()
    beta.seen.clear()
    for _ in range(4):
        await _call(gateway, "POST", "/v1/chat/completions?x=1", json={"model": "m"})
    assert {r["path"] for r in alpha.seen} == {"/v1/chat/completions?x=1"}
    assert {json.loads(r["body"])["model"] for r in alpha.seen} == {"m"}
    assert {r["path"] for r in beta.seen} == {"/api/paas/v4/chat/completions?x=1"}
    assert {json.loads(r["body"])["model"] for r in beta.seen} == {"m-beta"}
    attempts = [s for s in gateway.ext_proc.seen if s.stage == wire.STAGE_ATTEMPT]
    assert attempts and all(
        {"xds.route_metadata", wire.UPSTREAM_HOST_METADATA_ATTRIBUTE} <= set(s.attributes)
        for s in attempts
        if s.kind == "request_headers"
    )


async def test_route_without_rewrites_needs_no_attempt_stage(gateway: Gateway) -> None:
    before = len(gateway.ext_proc.seen)
    status, _, body = await _call(gateway, "POST", "/v1/chat/completions", json={"model": "s"})
    assert status == 200
    assert json.loads(body)["path"] == "/v1/chat/completions"
    stages = {s.stage for s in gateway.ext_proc.seen[before:]}
    assert stages == {wire.STAGE_ROUTING}


async def test_client_cannot_choose_a_route_by_header(gateway: Gateway) -> None:
    """A body-less request never reaches the routing stage's body handler; the header the
    client sent is dropped before routing, so it cannot select a provider."""
    status, content_type, body = await _call(
        gateway, "POST", "/v1/chat/completions", headers={wire.MODEL_HEADER: "s"}
    )
    error = _openai_error(status, content_type, body)
    assert status == 404
    assert error["code"] == "unknown_url"


async def test_dns_provider_over_tls(gateway: Gateway) -> None:
    secure = gateway.upstreams["secure"]
    status, _, body = await _call(
        gateway, "POST", "/v1/chat/completions",
        json={"model": "secure-model"}, headers={"authorization": "Bearer client-key"},
    )  # fmt: skip
    assert status == 200, body
    request = secure.seen[-1]
    assert request["headers"]["host"] == f"localhost:{secure.port}"
    assert request["headers"]["authorization"] == "Bearer sk-secure"


async def test_certificate_must_match_the_provider_name(gateway: Gateway) -> None:
    """Same CA, same server, but SNI/SAN name other.example: the handshake must fail."""
    secure = gateway.upstreams["secure"]
    before = len(secure.seen)
    status, content_type, body = await _call(
        gateway, "POST", "/v1/chat/completions", json={"model": "impostor-model"}
    )
    assert status == 503
    error = _openai_error(status, content_type, body)
    assert error["code"] == "upstream_connect_error"
    assert "CERTIFICATE_VERIFY_FAILED" in error["message"]
    assert len(secure.seen) == before


async def test_no_upstream_is_an_openai_503(gateway: Gateway) -> None:
    status, content_type, body = await _call(
        gateway, "POST", "/v1/chat/completions", json={"model": "dead-model"}
    )
    error = _openai_error(status, content_type, body)
    assert status == 503
    # Nothing listens there: refused, retried, then Envoy's own 503 with the cause's code.
    assert (error["type"], error["code"]) == ("server_error", "upstream_connect_error")
    assert "Connection_refused" in error["message"]


async def test_body_over_the_limit_is_an_openai_413(gateway: Gateway) -> None:
    payload = {"model": "s", "pad": "x" * BODY_LIMIT}
    status, content_type, body = await _call(gateway, "POST", "/v1/chat/completions", json=payload)
    error = _openai_error(status, content_type, body)
    assert status == 413
    assert error["code"] == "request_too_large"
    assert str(BODY_LIMIT) in error["message"]


async def test_filter_json_reply_passes_through_unchanged(gateway: Gateway) -> None:
    model = fake_ext_proc.LIMITED_MODEL
    status, content_type, body = await _call(
        gateway, "POST", "/v1/chat/completions", json={"model": model}
    )
    assert (status, content_type) == (429, "application/json")
    assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"  # not wrapped again


async def test_ext_proc_failure_is_an_openai_500(gateway: Gateway) -> None:
    model = fake_ext_proc.EXPLODING_MODEL
    status, content_type, body = await _call(
        gateway, "POST", "/v1/chat/completions", json={"model": model}
    )
    error = _openai_error(status, content_type, body)
    assert status == 500
    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    assert "ext_proc" in error["message"]


async def test_ext_proc_timeout_is_an_openai_504(gateway: Gateway) -> None:
    model = fake_ext_proc.SLOW_MODEL
    status, content_type, body = await _call(
        gateway, "POST", "/v1/chat/completions", json={"model": model}
    )
    error = _openai_error(status, content_type, body)
    assert status == 504
    assert error["code"] == "upstream_timeout"
    assert "timed out" in error["message"]
