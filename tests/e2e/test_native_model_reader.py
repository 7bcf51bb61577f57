"""The native model reader against the Lua one, through two real Envoys 1.40
(docs/native-filters.md, "The model reader").

One translation, two Envoys: "lua" with the Lua model reader (xds/translate/model_reader.py),
"native" with sluicegate's library (built here with gcc) in its place; the same routing
stage (a real ext_proc server) behind both, for the exact lane's clients and an auto
tenant's held model. An echo provider answers every request with what it received (path,
body, the client header), so a spliced body shows. Each request goes through both; the
status, the answer and what the reader wrote (the request's `sluicegate` metadata, as
Envoy logged it, and the usage Envoy read) must be the same.

Tenants: `alpha` in the fast lane, limited to two models and the standard class, its
tokens limited (so estimates are written); `beta` auto (a gated model is held in the exact
lane); `gamma` in the exact lane; `delta` may use one model, named `*`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from sluicegate import wire
from sluicegate.config import hash_key
from sluicegate.model import Gateway
from tests.translate.cases import load_case, model_from

from .access_log_collector import RECORD_ID
from .native_arms import Arms, native_arms

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

ARMS: Final = ("lua", "native")
KEYS: Final = {
    "alpha": "sk-reader-alpha-0001",
    "beta": "sk-reader-beta-0001",
    "gamma": "sk-reader-gamma-0001",
    "delta": "sk-reader-delta-0001",
}
# What the model reader writes into the `sluicegate` namespace (and the routing stage,
# for the requests it decides: the same in both arms).
READER_KEYS: Final = (
    "model", "stream", "body_problem", wire.META_PRIORITY, wire.META_TENANT,
    wire.META_KEY_NAME, wire.META_SCENARIO_ASKED, wire.META_ESTIMATE_INPUT,
    wire.META_ESTIMATE_OUTPUT, wire.META_ESTIMATE_TOKENS, wire.META_AUTO_LANE,
    wire.META_CHARGED_TENANT, wire.META_USAGE_INJECTED,
)  # fmt: skip


def _tenant(name: str, **extra: Any) -> dict[str, Any]:
    secret = {"file": f"keys/{name}.client"}
    key = {"name": f"{name}-key", "hash": hash_key(KEYS[name]), "secret": secret}
    return {"name": name, "keys": [key], **extra}


def document(listen_port: int, provider_port: int) -> dict[str, Any]:
    echo = {"name": "echo", "base_url": f"http://127.0.0.1:{provider_port}/v1"}
    return {
        "version": 1,
        "admission": {"lane": "fast"},
        "listeners": [{"name": "main", "port": listen_port}],
        "providers": [echo],
        "scenarios": ["chat", "long-generation"],
        "routes": [
            {"name": "chat", "models": ["m", "org/m2", "m3", "*"], "scenario": "chat",
             "backends": [{"provider": "echo"}]},
            {"name": "gated", "models": ["g"], "backends": [{"provider": "echo"}],
             "concurrency": {"max_requests": 8, "headroom": 0.25}},
        ],
        "tenants": [
            _tenant("alpha", models=["m", "org/m2"], priority="standard",
                    rate_limits={"tokens": 100_000_000, "per": "1m"}),
            _tenant("beta", lane="auto",
                    rate_limits={"requests": 100_000, "tokens": 100_000_000, "per": "1m"}),
            _tenant("gamma", lane="exact"),
            # A model named `*` (names may be): not every model.
            _tenant("delta", models=["*"]),
        ],
    }  # fmt: skip


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    answer = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        "echo": {
            "path": request.path_qs,
            "body": body.decode("utf-8", "replace"),
            "client": request.headers.get(wire.CLIENT_HEADER),
        },
    }
    return web.json_response(answer)


def _write_config(tmp: Path, doc: dict[str, Any]) -> Path:
    (tmp / "keys").mkdir(exist_ok=True)
    for name, key in KEYS.items():
        (tmp / "keys" / f"{name}.client").write_text(key + "\n")
    path = tmp / "sluicegate.yaml"
    path.write_text(json.dumps(doc))
    return path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def arms(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Arms]:
    tmp = tmp_path_factory.mktemp("native-model-reader")

    def model_for(arm: str, port: int, provider_port: int) -> Gateway:
        folder = tmp / f"config-{arm}"
        folder.mkdir()
        path = _write_config(folder, document(port, provider_port))
        return model_from(*load_case(path), path)

    async with native_arms(tmp, ARMS, echo, model_for) as running:
        yield running


@dataclass(frozen=True)
class Exchange:
    status: int
    answer: Any
    wrote: dict[str, Any]
    usage: dict[str, Any]


async def _pieces(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]
        await asyncio.sleep(0.002)  # each piece its own read at Envoy


async def exchange(arms: Arms, arm: str, case: Case) -> Exchange:
    request_id = f"reader-{arm}-{time.monotonic_ns()}"
    headers: list[tuple[str, str]] = [(RECORD_ID, request_id)]
    if case.tenant is not None:
        headers.append(("authorization", f"Bearer {KEYS[case.tenant]}"))
    headers += [(name, value) for name, value in case.headers]
    data: Any = case.body if case.chunk is None else _pieces(case.body, case.chunk)
    async with (
        aiohttp.ClientSession() as session,
        session.post(arms.urls[arm] + case.path, data=data, headers=headers) as response,
    ):
        received = await response.read()
        status = response.status
    entry = await arms.collector.entry(request_id)
    meta = entry.metadata.get(wire.METADATA_NAMESPACE, {})
    try:
        answer = json.loads(received)
    except ValueError:
        answer = received
    return Exchange(
        status,
        answer,
        {key: meta[key] for key in READER_KEYS if key in meta},
        entry.metadata.get(wire.USAGE_METADATA_NAMESPACE, {}),
    )


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    tenant: str | None = "alpha"
    path: str = "/v1/chat/completions"
    headers: Sequence[tuple[str, str]] = ()
    chunk: int | None = None  # the body sent in pieces of this many bytes


def _chat(model: str = "m", **extra: Any) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       **extra}).encode()  # fmt: skip


LONG_PROMPT: Final = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "word " * 3000}], "stream": True}
).encode()
UNICODE: Final = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "héllo 世界 \U0001f600"}]},
    ensure_ascii=False,
).encode()

CASES: Final = [
    Case("a plain chat", _chat()),
    Case("a stream, usage asked for the client and the body spliced", _chat(stream=True)),
    Case("a stream whose client asked", _chat(stream=True,
                                              stream_options={"include_usage": True})),
    Case("a stream with empty options", _chat(stream=True, stream_options={})),
    Case("a stream on the completions endpoint", _chat(stream=True), path="/v1/completions"),
    Case("a stream on the responses endpoint (no option there)", _chat(stream=True),
         path="/v1/responses"),
    Case("a stream, query and trailing slash", _chat(stream=True),
         path="/v1/chat/completions/?x=1"),
    Case("a null stream", _chat(stream=None)),
    Case("a cap and n", _chat(max_tokens=300, n=3)),
    Case("two caps, the first used", _chat(max_completion_tokens=200, max_tokens=5000)),
    Case("a cap over the log's bound: usage unread", _chat(max_tokens=5000)),
    Case("log probabilities asked: usage unread", _chat(logprobs=True)),
    Case("log probabilities not asked", _chat(logprobs=False, top_logprobs=0)),
    Case("log probabilities as empty brackets", _chat(logprobs=[], top_logprobs={})),
    Case("another endpoint: usage unread", _chat(), path="/v1/embeddings"),
    Case("a model named with an escaped slash", b'{"model": "org\\/m2", "messages": []}'),
    Case("a model another escape keeps", b'{"model": "m\\u0033", "messages": []}'),
    Case("a model the tenant may not use", _chat("m3")),
    Case("a model no route serves", _chat("nope")),
    Case("prompt members counted, non-ASCII", UNICODE),
    Case("a long prompt in pieces", LONG_PROMPT, chunk=1000),
    Case("a body in one-byte pieces", _chat(stream=True), chunk=1),
    Case("no body", b""),
    Case("a lower class asked", _chat(), headers=[(wire.PRIORITY_HEADER, " Batch ")]),
    Case("a higher class asked", _chat(), headers=[(wire.PRIORITY_HEADER, "interactive")]),
    Case("an unknown class asked", _chat(), headers=[(wire.PRIORITY_HEADER, "gold")]),
    Case("the last of two classes", _chat(), headers=[(wire.PRIORITY_HEADER, "interactive"),
                                                      (wire.PRIORITY_HEADER, "batch")]),
    Case("an empty class asked", _chat(), headers=[(wire.PRIORITY_HEADER, " ")]),
    Case("a scenario asked", _chat(), headers=[(wire.SCENARIO_HEADER, "long-generation")]),
    Case("a long scenario, cut", _chat(), headers=[(wire.SCENARIO_HEADER, "s" * 200)]),
    Case("two scenarios, joined", _chat(), headers=[(wire.SCENARIO_HEADER, "a"),
                                                    (wire.SCENARIO_HEADER, "b")]),
    Case("an auto tenant's fast model", _chat(), tenant="beta"),
    Case("an auto tenant's held model, to the routing stage", _chat("g"), tenant="beta"),
    Case("an exact-lane tenant", _chat(), tenant="gamma"),
    Case("a tenant of the model named *, asking for it", _chat("*"), tenant="delta"),
    Case("a tenant of the model named *, asking for another", _chat(), tenant="delta"),
    Case("no key", _chat(), tenant=None),
    Case("a client header of the client's own", _chat(),
         headers=[(wire.CLIENT_HEADER, "fast/beta/beta-key")]),
    Case("a client header of the client's own, no key", _chat(), tenant=None,
         headers=[(wire.CLIENT_HEADER, "fast/nobody/x")]),
    Case("not JSON", b"not json at all"),
    Case("trailing text", b'{"model": "m"} and more'),
    Case("brackets of two kinds", b"[1, 2}"),
    Case("a top-level array", b"[1, 2]"),
    Case("a top-level number", b"-1.5e3"),
    Case("a leading zero", b"01"),
    Case("an escaped key", b'{"mod\\u0065l": "m"}'),
    Case("a key in another case", b'{"model": "m", "Messages": []}'),
    Case("a non-ASCII key", '{"model": "m", "modél": 1}'.encode()),
    Case("no model", b'{"messages": []}'),
    Case("an empty model", b'{"model": ""}'),
    Case("a number for a model", b'{"model": 5}'),
    Case("a stream that is text", b'{"model": "m", "stream": "yes"}'),
    Case("a repeated model", b'{"n": 1, "n": 1, "model": "m", "model": "m3"}'),
    Case("a repeated prompt", b'{"model": "m", "messages": [], "messages": []}'),
    Case("a negative cap", b'{"model": "m", "max_tokens": -5}'),
    Case("a cap as a float", b'{"model": "m", "max_tokens": 1e5}'),
    Case("a zero cap", b'{"model": "m", "max_completion_tokens": 0}'),
    Case("too many choices", b'{"model": "m", "n": 129}'),
    Case("deep nesting", b'{"model": "m", "x": ' + b"[" * 3000 + b"]" * 3000 + b"}"),
    Case("unbalanced nesting", b'{"model": "m", "x": [[{]]}'),
    Case("a string with escaped quotes", b'{"x": "a \\"model\\": \\\\", "model": "m"}'),
    Case("whitespace everywhere", b' \r\n{ "model" :\t"m" ,\n"stream" : true } \n'),
    Case("an empty object", b"{}"),
    Case("only whitespace", b"   "),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_the_native_reader_does_what_the_lua_reader_does(arms: Arms, case: Case) -> None:
    lua = await exchange(arms, "lua", case)
    native = await exchange(arms, "native", case)
    assert (native.status, native.answer) == (lua.status, lua.answer)
    assert native.wrote == lua.wrote
    assert native.usage == lua.usage


async def test_the_cases_reach_every_outcome(arms: Arms) -> None:
    """The corpus is not all refusals: it routes, refuses, splices and holds."""
    by_name = {case.name: case for case in CASES}
    plain, spliced, held = [
        await exchange(arms, "native", by_name[name])
        for name in ("a plain chat", "a stream, usage asked for the client and the body spliced",
                     "an auto tenant's held model, to the routing stage")
    ]  # fmt: skip
    assert plain.status == 200 and plain.wrote[wire.META_CHARGED_TENANT] == "alpha"
    assert wire.META_ESTIMATE_TOKENS in plain.wrote
    assert spliced.answer["echo"]["body"].startswith('{"stream_options":{"include_usage":true},')
    assert held.answer["echo"]["client"] is None  # the routing stage decided it
    assert held.wrote.get(wire.META_CHARGED_TENANT) is None
