"""Which 429s and 503s are the gateway's: those with the refusal header (its value is
the code), against a fake upstream that answers both kinds, and queue times reported."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from sluicegate.bench import BenchSpec, run_bench

ANSWER = {"choices": [{"message": {"content": "ok"}}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 2}}  # fmt: skip


def _error(code: str) -> str:
    return json.dumps({"error": {"message": "no", "type": "requests", "code": code}})


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    """Every 4 requests: a gateway refusal (429), a gateway shed (503), a provider's 429,
    and a success that queued 40 ms."""
    turn = itertools.count()

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        step = next(turn) % 4
        if step == 0:
            return web.Response(status=429, text=_error("rate_limit_exceeded"),
                                content_type="application/json",
                                headers={"x-sluicegate-refusal": "rate_limit_exceeded",
                                         "Retry-After": "2"})  # fmt: skip
        if step == 1:
            return web.Response(status=503, text=_error("queue_full"),
                                content_type="application/json",
                                headers={"X-Sluicegate-Refusal": "queue_full",
                                         "Retry-After": "1"})  # fmt: skip
        if step == 2:
            return web.Response(status=429, text=_error("rate_limit_exceeded"),
                                content_type="application/json",
                                headers={"Retry-After": "5"})  # fmt: skip
        return web.json_response(ANSWER, headers={"x-sluicegate-queue-ms": "40"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_refusals_are_counted_apart_from_provider_errors(upstream: str) -> None:
    spec = BenchSpec(url=upstream, model="m", stream=False, concurrency=1, requests=40,
                     processes=1)  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    refusals = figures["refusals"]
    assert refusals["total"] == 20
    assert refusals["by_status"] == {"429": 10, "503": 10}
    assert refusals["by_code"] == {"queue_full": 10, "rate_limit_exceeded": 10}
    assert refusals["retry_after"]["max"] == 2.0 and refusals["retry_after"]["min"] == 1.0
    errors = figures["errors"]
    assert errors["total"] == 10 and errors["by_status"] == {"429": 10}
    assert figures["requests"] == {"measured": 40, "ok": 10, "failed": 30, "dropped": 0}
    assert figures["queue"]["p50"] == pytest.approx(0.040)
    assert figures["queue"]["count"] == 10


async def test_another_refusal_header(upstream: str) -> None:
    spec = BenchSpec(url=upstream, model="m", stream=False, concurrency=1, requests=8,
                     processes=1, refusal_header="x-other-refusal")  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    assert figures["refusals"]["total"] == 0
    assert figures["errors"]["by_status"] == {"429": 4, "503": 2}
