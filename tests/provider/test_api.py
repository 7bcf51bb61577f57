"""The OpenAI-compatible surface, driven through the official openai SDK."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from sluicegate.provider import RunningMockProvider
from tests.provider.conftest import API_KEY, StartProvider, user


async def test_chat_completion_json(client: AsyncOpenAI) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=user("x" * 40)
    )
    assert raw.headers["x-mock-provider"] == "alpha"
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-4o-mini"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "tok1 tok2 tok3 tok4 "
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 10  # 40 chars / 4
    assert completion.usage.completion_tokens == 4
    assert completion.usage.total_tokens == 14


async def test_model_is_echoed(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(model="m2", messages=user())
    assert completion.model == "m2"


async def test_max_tokens_caps_output(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="m2", messages=user(), max_completion_tokens=2
    )
    assert completion.choices[0].message.content == "tok1 tok2 "
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 2


async def test_stream_is_flushed_chunk_by_chunk(start_provider: StartProvider) -> None:
    provider = await start_provider(name="alpha", ttft_ms=10, itl_ms=30, output_tokens=10)

    async def one_stream() -> tuple[list[Any], list[float]]:
        chunks = []
        arrivals: list[float] = []
        async with AsyncOpenAI(
            base_url=provider.url + "/v1", api_key="any", max_retries=0
        ) as client:
            sent = time.monotonic()
            stream = await client.chat.completions.create(
                model="gpt-4o-mini", messages=user(), stream=True
            )
            async for chunk in stream:
                chunks.append(chunk)
                if chunk.choices and chunk.choices[0].delta.content:
                    arrivals.append(time.monotonic() - sent)
        return chunks, arrivals

    def spread_out(arrivals: list[float]) -> bool:
        # Nine 30 ms gaps (270 ms): a buffered response would deliver every chunk at once.
        return arrivals[-1] - arrivals[0] > 0.15 and arrivals[4] - arrivals[0] > 0.05

    # Arrival times are the client's: a client stalled on a loaded machine reads chunks
    # that came apart together. A buffered response comes at once every time; a stall
    # three times in a row is not seen (with one try, it failed in two full runs of the suite).
    for _ in range(3):
        chunks, arrivals = await one_stream()
        contents = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
        assert contents == [f"tok{i} " for i in range(1, 11)]
        assert chunks[0].object == "chat.completion.chunk"
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert all(chunk.model == "gpt-4o-mini" for chunk in chunks)
        assert len({chunk.id for chunk in chunks}) == 1
        assert len(arrivals) == 10
        if spread_out(arrivals):
            return
    raise AssertionError(f"every chunk came at once three times: {arrivals}")


async def test_stream_include_usage(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=user("abcd" * 5),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-2].choices[0].finish_reason == "stop"
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (5, 4)
    assert all(chunk.usage is None for chunk in chunks[:-1])


async def test_stream_wire_format_ends_with_done(provider: RunningMockProvider) -> None:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as session,
        session.post(
            provider.url + "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": user(), "stream": True},
        ) as response,
    ):
        assert response.headers["Content-Type"].startswith("text/event-stream")
        body = (await response.read()).decode()
    events = body.split("\n\n")
    assert events[-1] == ""
    assert events[-2] == "data: [DONE]"
    assert all(event.startswith("data: {") for event in events[:-2])
    assert len(events[:-2]) == 5  # four tokens and the finish chunk


async def test_a_stream_pauses_before_its_end_when_asked(client: AsyncOpenAI) -> None:
    """x-mock-end-pause-ms holds the finish chunk, the usage and [DONE] back, and not the
    tokens (a benchmark times a stream's end apart from them); a lower bound only."""
    stream = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=user(),
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-mock-end-pause-ms": "300", "x-mock-output-tokens": "3"},
    )
    arrived = [(chunk, time.monotonic()) async for chunk in stream]
    tokens = [at for chunk, at in arrived if chunk.choices and chunk.choices[0].delta.content]
    finish = next(at for chunk, at in arrived if chunk.choices and chunk.choices[0].finish_reason)
    assert len(tokens) == 3
    assert finish - tokens[-1] >= 0.3
    assert arrived[-1][0].usage is not None


async def test_auth_required(provider: RunningMockProvider) -> None:
    async with AsyncOpenAI(
        base_url=provider.url + "/v1", api_key="sk-wrong", max_retries=0
    ) as bad_client:
        with pytest.raises(openai.AuthenticationError) as caught:
            await bad_client.chat.completions.create(model="gpt-4o-mini", messages=user())
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"
    assert "sk-wrong" not in str(caught.value.body)
    stats = provider.stats()
    assert stats["by_status"] == {"401": 1}
    assert stats["last_request"]["authorization_present"] is True
    assert API_KEY not in str(stats) and "sk-wrong" not in str(stats)


async def test_models_listing(client: AsyncOpenAI) -> None:
    models = [model async for model in client.models.list()]
    assert [model.id for model in models] == ["gpt-4o-mini", "m2"]
    assert all(model.object == "model" and model.owned_by == "alpha" for model in models)


async def test_unknown_model_is_404(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model="gpt-9", messages=user())
    assert caught.value.code == "model_not_found"


async def test_any_model_accepted_when_none_configured(start_provider: StartProvider) -> None:
    provider = await start_provider()
    async with AsyncOpenAI(base_url=provider.url + "/v1", api_key="x", max_retries=0) as client:
        completion = await client.chat.completions.create(model="whatever-7b", messages=user())
    assert completion.model == "whatever-7b"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "missing_required_parameter"),
        (b'{"model": "m2"}', 400, "missing_required_parameter"),
        (
            b'{"model": "m2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            400,
            None,
        ),
        (
            b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "model_not_found",
        ),
    ],
)
async def test_invalid_requests(
    provider: RunningMockProvider, body: bytes, status: int, code: str | None
) -> None:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as session,
        session.post(provider.url + "/v1/chat/completions", data=body) as response,
    ):
        payload = await response.json()
        assert response.status == status
        assert response.headers["x-mock-provider"] == "alpha"
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["code"] == code


async def test_unknown_url_is_json_404(provider: RunningMockProvider) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(provider.url + "/v1/chat/completions") as response,
    ):
        assert response.status == 404
        assert response.headers["x-mock-provider"] == "alpha"
        payload = await response.json()
    assert payload["error"]["message"] == "Invalid URL (GET /v1/chat/completions)"


async def test_latency_and_length_headers(client: AsyncOpenAI) -> None:
    started = time.monotonic()
    completion = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=user(),
        extra_headers={"x-mock-ttft-ms": "200", "x-mock-output-tokens": "7"},
    )
    assert time.monotonic() - started >= 0.2
    assert completion.usage is not None and completion.usage.completion_tokens == 7


async def test_bad_override_header_is_400(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="x-mock-itl-ms"):
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=user(), extra_headers={"x-mock-itl-ms": "soon"}
        )


async def test_legacy_completions(client: AsyncOpenAI) -> None:
    completion = await client.completions.create(model="m2", prompt="abcdabcd", max_tokens=3)
    assert completion.object == "text_completion"
    assert completion.model == "m2"
    assert completion.choices[0].text == "tok1 tok2 tok3 "
    assert completion.usage is not None and completion.usage.prompt_tokens == 2
    stream = await client.completions.create(model="m2", prompt="x", stream=True)
    texts = [chunk.choices[0].text async for chunk in stream]
    assert "".join(texts) == "tok1 tok2 tok3 tok4 "


@pytest.mark.parametrize("early", [False, True])
async def test_when_headers_are_sent(start_provider: StartProvider, early: bool) -> None:
    # OpenAI-like: headers come with the first token; early_headers: right away (vLLM-like).
    provider = await start_provider(ttft_ms=500, early_headers=early)
    body = {"model": "m", "messages": user(), "stream": True}
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(provider.url + "/v1/chat/completions", json=body) as response:
            headers_after = time.monotonic() - started
            await response.read()
    assert (headers_after < 0.35) is early
