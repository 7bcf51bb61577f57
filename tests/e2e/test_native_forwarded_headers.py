"""The native forwarded headers filter against Envoy's header_mutation, through two real
Envoys 1.40 (xds/translate/forwarded_headers.py, c/forwarded_headers.c).

One translation, two Envoys: "envoy" with the header_mutation filters (one per route
whose providers receive the same, a composite on x-sluicegate-provider otherwise),
"native" with sluicegate's library (built here with gcc) in their place; the same
routing stage behind both. Three providers on one echo server, told apart by their
paths: `a` forwards `x-stainless-*` and Idempotency-Key and sets OpenAI-Organization and
User-Agent (on the built-in list: a client's values are replaced, duplicates included);
`b` has the defaults; `c` forwards `x-trace-*` and sets OpenAI-Project. Route `same`
sends to `c` alone (one list); `mixed-a` and `mixed-b` send to `a` or `b` first (a
block per provider). The echo answers with the headers it received, in order.

Each request (fixed cases, then random ones from a seeded generator: names on the lists,
near misses, hostile and internal headers, other spellings, random tokens; duplicates)
goes through both; the provider must receive exactly the same header list from both.
Envoy makes up x-request-id (a client's too), so its value is compared as a placeholder.
"""

from __future__ import annotations

import json
import random
import string
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from multidict import CIMultiDict

from sluicegate import wire
from sluicegate.model import Gateway
from tests.translate.cases import load_case, model_from

from .native_arms import Arms, native_arms

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

ARMS: Final = ("envoy", "native")
SEED: Final = 20240611
RANDOM_CASES: Final = 150
# model -> the provider its route sends to, and that provider's fixed headers.
PROVIDER_OF: Final = {"same": "c", "ma": "a", "mb": "b"}
FIXED: Final = {
    "a": {"openai-organization": "org-gw", "user-agent": "gateway-agent/1"},
    "b": {},
    "c": {"openai-project": "proj_gw"},
}
BUILT_IN: Final = (
    "accept", "content-type", "openai-beta", "traceparent", "tracestate", "user-agent",
    "x-request-id",
)  # fmt: skip
FORWARDS: Final = {"a": ("x-stainless-*", "idempotency-key"), "b": (), "c": ("x-trace-*",)}
ALLOWED: Final = (*BUILT_IN, "idempotency-key")  # every name on a list
NEAR_MISSES: Final = (
    "accep", "accept-x", "accepts", "user-agen", "x-stainless", "x-stainless-",
    "x-stainless-os", "x-stainlessos", "x-trace", "x-trace-", "x-trace-id", "idempotency-keys",
)  # fmt: skip
HOSTILE: Final = (
    "cookie", "proxy-authorization", "x-api-key", "x-forwarded-for", "x-real-ip",
    "forwarded", "openai-organization", "openai-project", wire.PROVIDER_HEADER,
    "x-envoy-original-path", "x-sluicegate-model",
)  # fmt: skip
SPELLINGS: Final = ("X-Stainless-OS", "Accept", "User-Agent", "IDEMPOTENCY-KEY", "X-Trace-Id")
POOL: Final = (*ALLOWED, *NEAR_MISSES, *HOSTILE, *SPELLINGS)
# Envoy rejects or rewrites these at the downstream: not what this test is about.
AVOID: Final = ("host", "content-length", "connection", "transfer-encoding", "te", "upgrade",
                "keep-alive", "expect")  # fmt: skip
NORMALISED: Final = "<x-request-id>"


def document(listen_port: int, provider_port: int) -> dict[str, Any]:
    def at(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "base_url": f"http://127.0.0.1:{provider_port}/{name}/v1", **extra}

    return {
        "version": 1,
        "listeners": [{"name": "main", "port": listen_port}],
        "providers": [
            at("a", forward_headers=["X-Stainless-*", "Idempotency-Key"],
               headers={"OpenAI-Organization": "org-gw", "User-Agent": "gateway-agent/1"}),
            at("b"),
            at("c", forward_headers=["x-trace-*"], headers={"OpenAI-Project": "proj_gw"}),
        ],
        "routes": [
            {"name": "same", "models": ["same"], "backends": [{"provider": "c"}]},
            {"name": "mixed-a", "models": ["ma"],
             "backends": [{"provider": "a"}, {"provider": "b", "priority": 1}]},
            {"name": "mixed-b", "models": ["mb"],
             "backends": [{"provider": "b"}, {"provider": "a", "priority": 1}]},
        ],
    }  # fmt: skip


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    received = [[k.decode("latin-1").lower(), v.decode("latin-1")] for k, v in request.raw_headers]
    answer = {
        "object": "chat.completion",
        "model": json.loads(body)["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        "echo": {"path": request.path, "headers": received},
    }
    return web.json_response(answer)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def arms(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Arms]:
    tmp = tmp_path_factory.mktemp("native-forwarded-headers")

    def model_for(arm: str, port: int, provider_port: int) -> Gateway:
        path = tmp / f"config-{arm}.yaml"
        path.write_text(json.dumps(document(port, provider_port)))
        return model_from(*load_case(path), path)

    async with native_arms(tmp, ARMS, echo, model_for) as running:
        yield running


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    headers: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        # aiohttp replaces a name's values when it is spelt otherwise again: each name is
        # sent as it is first spelt, so all its values go.
        first: dict[str, str] = {}
        spelt = tuple((first.setdefault(n.lower(), n), v) for n, v in self.headers)
        object.__setattr__(self, "headers", spelt)


def _value(rng: random.Random, name: str) -> str:
    if name.lower() == "x-request-id":
        return str(uuid.UUID(int=rng.getrandbits(128)))
    if name.lower() == wire.PROVIDER_HEADER:
        return rng.choice(("a", "b", "c", "zzz"))
    inner = "".join(rng.choice(string.printable[:95]) for _ in range(rng.randint(0, 30)))
    ends = string.printable[:94]  # printable ASCII, no space
    return rng.choice(ends) + inner + rng.choice(ends) if inner else rng.choice(ends)


def _name(rng: random.Random) -> str:
    """A name of the pool, or a random token (of 3 characters or more: none of AVOID's)."""
    if rng.random() < 0.8:
        return rng.choice(POOL)
    rest = rng.choices(string.ascii_letters + string.digits + "-_.", k=rng.randint(2, 14))
    return rng.choice(string.ascii_letters) + "".join(rest)


def _random_cases() -> list[Case]:
    rng = random.Random(SEED)
    cases = []
    for i in range(RANDOM_CASES):
        names = [_name(rng) for _ in range(rng.randint(0, 12))]
        if names and rng.random() < 0.3:  # a duplicate, not necessarily next to its twin
            names.insert(rng.randrange(len(names) + 1), rng.choice(names))
        headers = tuple((name, _value(rng, name)) for name in names)
        cases.append(Case(f"random-{i}", rng.choice(sorted(PROVIDER_OF)), headers))
    return cases


FIXED_CASES: Final = [
    ("no headers", ()),
    ("every allowed name", tuple((n, f"v-{n}") for n in ALLOWED if n != "x-request-id")),
    ("what a and c forward", (("x-stainless-os", "Linux"), ("X-Stainless-Lang", "python"),
                              ("x-trace-id", "t1"), ("Idempotency-Key", "k1"))),
    ("every hostile name", tuple((n, "b" if n == wire.PROVIDER_HEADER else f"evil-{n}")
                                 for n in HOSTILE)),
    ("fixed headers sent twice", (("user-agent", "client/1"), ("openai-organization", "org-c"),
                                  ("accept", "*/*"), ("User-Agent", "client/2"),
                                  ("openai-project", "p1"), ("OpenAI-Organization", "org-d"),
                                  ("openai-project", "p2"))),
    *((f"provider header {p}", ((wire.PROVIDER_HEADER, p), ("x-stainless-os", "x"),
                                ("x-trace-id", "y"))) for p in ("a", "b", "c", "zzz")),
    ("near misses", tuple((n, f"near-{n}") for n in NEAR_MISSES)),
    ("spellings", tuple((n, f"v-{n}") for n in SPELLINGS)),
    ("an allowed name again and again", (("accept", "1"), ("cookie", "c"), ("accept", "2"),
                                         ("x-api-key", "k"), ("accept", "3"))),
]  # fmt: skip
CASES: Final = [
    Case(f"{name} ({model})", model, headers)
    for name, headers in FIXED_CASES
    for model in sorted(PROVIDER_OF)
] + _random_cases()


@dataclass(frozen=True)
class Received:
    path: str
    headers: list[tuple[str, str]]


async def send(arms: Arms, arm: str, case: Case) -> Received:
    body = {"model": case.model, "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession(skip_auto_headers=("User-Agent", "Accept")) as session,
        session.post(
            arms.urls[arm] + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers=CIMultiDict(case.headers),
            skip_auto_headers=("Content-Type",),
        ) as response,
    ):
        text = await response.text()
        assert response.status == 200, f"{arm}: {response.status} {text}"
    echoed = json.loads(text)["echo"]
    headers = [(n, NORMALISED if n == "x-request-id" else v) for n, v in echoed["headers"]]
    return Received(echoed["path"], headers)


def _allowed_for(provider: str, name: str) -> bool:
    """Independently of the translator: what the provider may receive from a client."""
    return name in BUILT_IN or any(name.startswith(e[:-1]) if e.endswith("*") else name == e
                                   for e in FORWARDS[provider])  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_the_provider_receives_the_same_headers_from_both(arms: Arms, case: Case) -> None:
    envoy = await send(arms, "envoy", case)
    native = await send(arms, "native", case)
    sent = f"seed {SEED}, sent {list(case.headers)}"
    both = f"{sent}\nenvoy:  {envoy}\nnative: {native}"
    assert (native.path, native.headers) == (envoy.path, envoy.headers), both
    provider = PROVIDER_OF[case.model]
    assert native.path == f"/{provider}/v1/chat/completions"
    fixed = FIXED[provider]
    strays = [n for n, _ in native.headers if n not in (*fixed, "host", "content-length")
              and not _allowed_for(provider, n)]  # fmt: skip
    assert not strays, f"{sent}: {provider} received {strays}"
    for name, value in fixed.items():
        assert [v for n, v in native.headers if n == name] == [value], sent
    if provider == "a":
        stainless = [
            (n.lower(), v) for n, v in case.headers if n.lower().startswith("x-stainless-")
        ]
        assert [(n, v) for n, v in native.headers if n.startswith("x-stainless-")] == stainless


async def test_the_cases_send_what_matters() -> None:
    """The corpus holds duplicates, every hostile name and a spoofed provider per provider."""
    sent = [(case.model, name.lower()) for case in CASES for name, _ in case.headers]
    assert {name for _, name in sent} >= {*HOSTILE, *NEAR_MISSES, *ALLOWED}
    assert not {name for _, name in sent} & set(AVOID)
    assert any(
        len({n.lower() for n, _ in c.headers}) < len(c.headers) for c in CASES[-RANDOM_CASES:]
    )
    assert {(model, wire.PROVIDER_HEADER) for model in PROVIDER_OF} <= set(sent)
