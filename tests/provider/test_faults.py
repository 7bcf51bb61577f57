"""Fault injection by header (deterministic) and by rate (seeded)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from sluicegate.provider import RunningMockProvider
from tests.provider.conftest import API_KEY, StartProvider, user

CHAT = "/v1/chat/completions"


def fault(kind: str, **extra: str) -> dict[str, str]:
    return {"x-mock-fault": kind, **extra}


async def test_429_carries_retry_after(client: AsyncOpenAI, provider: RunningMockProvider) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=user(), extra_headers=fault("429")
        )
    assert caught.value.response.headers["retry-after"] == "1"
    assert caught.value.response.headers["x-mock-provider"] == "alpha"
    assert caught.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=user(),
            extra_headers=fault("429", **{"x-mock-retry-after": "7"}),
        )
    assert caught.value.response.headers["retry-after"] == "7"
    assert provider.stats()["by_fault"] == {"429": 2}


@pytest.mark.parametrize("status", [500, 503])
async def test_server_errors(client: AsyncOpenAI, status: int) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=user(), extra_headers=fault(str(status))
        )
    assert caught.value.status_code == status
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == "server_error"


async def test_reset_is_a_connection_error(
    client: AsyncOpenAI, provider: RunningMockProvider
) -> None:
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=user(), extra_headers=fault("reset")
        )
    stats = provider.stats()
    assert stats["by_fault"] == {"reset": 1}
    assert stats["by_status"] == {}  # nothing was answered


async def test_reset_is_an_rst(provider: RunningMockProvider) -> None:
    host, port = provider.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nx-mock-fault: reset\r\n"
            + f"Authorization: Bearer {API_KEY}\r\n\r\n".encode()
        )
        # SO_LINGER 0 makes the kernel send RST: a read fails instead of seeing a clean EOF.
        with pytest.raises(ConnectionResetError):
            data = await asyncio.wait_for(reader.read(), 2)
            raise AssertionError(f"clean close, got {data!r}")
    finally:
        writer.close()


async def test_cut_stream_ends_without_done(provider: RunningMockProvider) -> None:
    received = b""
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as session,
        session.post(
            provider.url + CHAT,
            json={"model": "m2", "messages": user(), "stream": True},
            headers=fault("cut", **{"x-mock-output-tokens": "10"}),
        ) as response,
    ):
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for piece in response.content.iter_any():
                received += piece
    assert b'"content":"tok1 "' in received
    assert b"[DONE]" not in received
    assert b'finish_reason":"stop' not in received


async def test_cut_stream_through_sdk(client: AsyncOpenAI) -> None:
    contents: list[str] = []
    stream = await client.chat.completions.create(
        model="m2", messages=user(), stream=True, extra_headers=fault("cut")
    )
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            contents.append(chunk.choices[0].delta.content or "")
    assert contents and contents[0] == "tok1 "


async def test_cut_json_body(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(
            model="m2", messages=user(), extra_headers=fault("cut")
        )


async def test_hang_times_out_and_is_released(
    provider: RunningMockProvider, client: AsyncOpenAI
) -> None:
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(
            model="m2", messages=user(), extra_headers=fault("hang"), timeout=0.3
        )
    assert time.monotonic() - started < 2
    # The client gave up; the server side of the request must not linger.
    for _ in range(100):
        if provider.stats()["in_flight"] == 0:
            break
        await asyncio.sleep(0.01)
    assert provider.stats()["in_flight"] == 0
    assert provider.stats()["by_fault"] == {"hang": 1}


async def test_close_does_not_wait_for_hung_requests(start_provider: StartProvider) -> None:
    provider = await start_provider()
    async with aiohttp.ClientSession() as session:
        hung = asyncio.create_task(
            session.post(
                provider.url + CHAT,
                json={"model": "m", "messages": user()},
                headers=fault("hang"),
            )
        )
        while provider.stats()["in_flight"] == 0:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await provider.close()
        assert time.monotonic() - started < 3
        with pytest.raises(aiohttp.ClientError):
            await hung


async def test_fault_provider_targets_one_provider(start_provider: StartProvider) -> None:
    alpha = await start_provider(name="alpha")
    beta = await start_provider(name="beta")
    headers = fault("500", **{"x-mock-fault-provider": "beta"})
    body = {"model": "m", "messages": user()}
    async with aiohttp.ClientSession() as session:
        async with session.post(alpha.url + CHAT, json=body, headers=headers) as response:
            assert (response.status, response.headers["x-mock-provider"]) == (200, "alpha")
        async with session.post(beta.url + CHAT, json=body, headers=headers) as response:
            assert (response.status, response.headers["x-mock-provider"]) == (500, "beta")
        headers["x-mock-fault-provider"] = "gamma, alpha"
        async with session.post(alpha.url + CHAT, json=body, headers=headers) as response:
            assert response.status == 500


async def test_header_none_overrides_rates(start_provider: StartProvider) -> None:
    provider = await start_provider(rate_503=1.0)
    body = {"model": "m", "messages": user()}
    async with aiohttp.ClientSession() as session:
        async with session.post(provider.url + CHAT, json=body) as response:
            assert response.status == 503
        async with session.post(provider.url + CHAT, json=body, headers=fault("none")) as response:
            assert response.status == 200


async def test_seeded_rates_are_reproducible(start_provider: StartProvider) -> None:
    settings = {"rate_429": 0.3, "rate_500": 0.2, "seed": 7}
    one = await start_provider(**settings)
    two = await start_provider(**settings)
    body = {"model": "m", "messages": user()}
    statuses: dict[str, list[int]] = {one.url: [], two.url: []}
    async with aiohttp.ClientSession() as session:
        for url in statuses:
            for _ in range(40):
                async with session.post(url + CHAT, json=body) as response:
                    statuses[url].append(response.status)
    assert statuses[one.url] == statuses[two.url]
    assert set(statuses[one.url]) == {200, 429, 500}


async def test_runtime_config_changes_behaviour(provider: RunningMockProvider) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "m2", "messages": user()}
    async with aiohttp.ClientSession(headers=auth) as session:
        async with session.post(
            provider.url + "/mock/config", json={"rate_500": 1, "output_tokens": 3}
        ) as response:
            assert response.status == 200
            view = await response.json()
        assert view["rate_500"] == 1.0 and view["api_key"] is None and view["api_key_set"]
        async with session.post(provider.url + CHAT, json=body) as response:
            assert response.status == 500
        async with session.post(provider.url + "/mock/config", json={"rate_500": 0}) as response:
            assert response.status == 200
        async with session.post(provider.url + CHAT, json=body) as response:
            payload = await response.json()
        assert payload["usage"]["completion_tokens"] == 3
        for bad in ({"port": 1}, {"rate_500": 2}, {"itl_ms": "fast"}, [1]):
            async with session.post(provider.url + "/mock/config", json=bad) as response:
                assert response.status == 400, bad
    assert provider.settings.rate_500 == 0


async def test_garbage_stream_has_malformed_events_and_no_usage(
    provider: RunningMockProvider,
) -> None:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as session,
        session.post(
            provider.url + CHAT,
            json={"model": "m2", "messages": user(), "stream": True,
                  "stream_options": {"include_usage": True}},
            headers=fault("garbage", **{"x-mock-output-tokens": "6"}),
        ) as response,
    ):  # fmt: skip
        assert response.status == 200
        received = await response.read()
    assert b"data: {this is not json" in received
    assert b'"usage":{' not in received  # asked for, never sent
    assert received.rstrip().endswith(b"data: [DONE]")
    assert received.count(b'"content":"tok') == 6


async def test_garbage_json_body_does_not_parse(provider: RunningMockProvider) -> None:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as session,
        session.post(
            provider.url + CHAT, json={"model": "m2", "messages": user()}, headers=fault("garbage")
        ) as response,
    ):
        assert response.status == 200
        body = await response.read()
    with pytest.raises(ValueError):
        json.loads(body)
