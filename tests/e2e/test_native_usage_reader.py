"""The native usage reader against Envoy's own three, through two real Envoys 1.40
(docs/native-filters.md).

One translation, two Envoys: "envoy" with json_to_metadata, sse_to_metadata and the stream
usage Lua filter, "native" with sluicegate's library (built here with gcc) in their place;
the same routing stage (real ext_proc server) before both, and a scripted provider that
answers each request with the canned answer its prompt names, cut into chunks as the
prompt says, with a usage event only when the request asks for one (as OpenAI does). Each
request goes through both; what the client receives and the usage Envoy logged (the
`sluicegate.usage` namespace of the request's access-log entry) must be the same.

Tenants: `metered` has a token limit, so its requests carry a reservation and their
streams' content events are counted by both; `open` has none, and only the native reader
counts its streams (the record's output when no usage comes; the Lua filter would cost
every stream). A stream whose client did not ask for usage gets it asked for by the
routing stage, and the usage event cut.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from sluicegate import wire
from sluicegate.model import Gateway, build_model
from tests.filters.admission_helpers import hashed
from tests.translate.cases import config_of

from .access_log_collector import RECORD_ID
from .native_arms import Arms, native_arms

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

METERED_KEY: Final = "sk-native-metered-0001"
OPEN_KEY: Final = "sk-native-open-0001"
ARMS: Final = ("envoy", "native")


def _chat_event(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [choice]})


USAGE_EVENT: Final = "data: " + json.dumps(
    {
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }
)
# A chat stream's events (without their blank lines): a role event, two with text (one
# whose text looks like a usage member), the finish; the usage event when asked; [DONE].
CHAT_EVENTS: Final = (
    _chat_event({"role": "assistant", "content": ""}),
    _chat_event({"content": "Hel"}),
    _chat_event({"content": 'lo "usage": {"prompt_tokens": 99}'}),
    _chat_event({}, "stop"),
)
DONE: Final = "data: [DONE]"
UNENDED_TAIL: Final = b'data: {"x":1}'  # the last bytes of a stream cut off mid-event
JSON_ANSWER: Final = {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": '"usage":{"x":1}'}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
}


def _responses_events(text_bytes: int) -> list[str]:
    """A Responses API stream whose final event carries `text_bytes` of text and usage."""
    completed = {
        "type": "response.completed",
        "response": {
            "output": [{"type": "message", "content": [{"text": "x" * text_bytes}]}],
            "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
        },
    }
    delta = {"type": "response.output_text.delta", "delta": "Hi"}
    return [
        "event: response.output_text.delta\ndata: " + json.dumps(delta),
        "event: response.completed\ndata: " + json.dumps(completed),
    ]


@dataclass(frozen=True)
class Answer:
    """What the scripted provider sends: a content type and the chunks of its body."""

    content_type: str
    chunks: tuple[bytes, ...]


def _chunked(body: bytes, chunking: str, blank: bytes = b"\n\n") -> tuple[bytes, ...]:
    """`body` in chunks: whole (`one`), one event a chunk (`events`: the body's events end
    at `blank`), or `split-N`: N bytes a chunk (events and numbers cut anywhere)."""
    if chunking == "one":
        return (body,)
    if chunking == "events":
        return tuple(part + blank for part in body.split(blank) if part)
    size = int(chunking.removeprefix("split-"))
    return tuple(body[i : i + size] for i in range(0, len(body), size))


def answer_for(request: dict[str, Any]) -> Answer:
    """The canned answer the request's prompt names: `<kind> <chunking> [<line end>]`."""
    kind, chunking, *rest = request["messages"][0]["content"].split()
    line_end = {"crlf": "\r\n", "cr": "\r"}.get(rest[0], "\n") if rest else "\n"
    if kind == "json":
        body = json.dumps(JSON_ANSWER).encode()
        return Answer("application/json; charset=utf-8", _chunked(body, chunking, b"}}"))
    tail = b""
    if kind == "responses":
        events = _responses_events(10_000)
    else:
        asked = (request.get("stream_options") or {}).get("include_usage") is True
        if kind == "unended":  # the provider stops in the middle of an event, before usage
            events, tail = list(CHAT_EVENTS), UNENDED_TAIL
        else:
            events = [*CHAT_EVENTS, *([USAGE_EVENT] if asked else []), DONE]
    body = "".join(event.replace("\n", line_end) + line_end * 2 for event in events).encode()
    chunks = _chunked(body, chunking, (line_end * 2).encode())
    if tail:
        chunks = (*chunks[:-1], chunks[-1] + tail) if chunking == "one" else (*chunks, tail)
    return Answer("text/event-stream", chunks)


# A stream that never ends: its first events, then nothing until the client leaves.
ENDLESS: Final = "endless"
ENDLESS_WAIT_S: Final = 20.0


def _closed(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def provider(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body["messages"][0]["content"] == ENDLESS:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in CHAT_EVENTS[:3]:
            await response.write(event.encode() + b"\n\n")
            await asyncio.sleep(0.002)
        # Until the client leaves (Envoy then closes this connection), bounded.
        deadline = time.monotonic() + ENDLESS_WAIT_S
        while not _closed(request) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return response
    answer = answer_for(body)
    response = web.StreamResponse(headers={"content-type": answer.content_type})
    await response.prepare(request)
    for chunk in answer.chunks:
        await response.write(chunk)
        await asyncio.sleep(0.002)  # each chunk its own read at Envoy
    await response.write_eof()
    return response


def document(listen_port: int, provider_port: int) -> str:
    return f"""
version: 1
admission: {{lane: exact}}
listeners: [{{name: main, port: {listen_port}}}]
providers:
  - {{name: scripted, base_url: "http://127.0.0.1:{provider_port}/v1"}}
routes:
  - {{name: chat, models: [m], backends: [{{provider: scripted}}]}}
tenants:
  - name: metered
    rate_limits: {{tokens: 1000000, per: 1m}}
    keys: [{{name: metered-key, hash: "{hashed(METERED_KEY)}"}}]
  - name: open
    keys: [{{name: open-key, hash: "{hashed(OPEN_KEY)}"}}]
"""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def arms(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Arms]:
    tmp = tmp_path_factory.mktemp("native-usage")

    def model_for(arm: str, port: int, provider_port: int) -> Gateway:
        return build_model(config_of(document(port, provider_port)), {})

    async with native_arms(tmp, ARMS, provider, model_for) as running:
        yield running


@dataclass(frozen=True)
class Exchange:
    status: int
    body: bytes
    usage: dict[str, Any]


async def exchange(
    arms: Arms, arm: str, body: dict[str, Any], key: str, path: str = "/v1/chat/completions"
) -> Exchange:
    request_id = f"native-{arm}-{time.monotonic_ns()}"
    headers = {RECORD_ID: request_id, "authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(arms.urls[arm] + path, json=body, headers=headers) as response,
    ):
        received = await response.read()
        status = response.status
    entry = await arms.collector.entry(request_id)
    return Exchange(status, received, entry.metadata.get(wire.USAGE_METADATA_NAMESPACE, {}))


def chat(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}], **extra}


ASKED: Final = {"stream": True, "stream_options": {"include_usage": True}}
NOT_ASKED: Final = {"stream": True}
NO_INJECTION: Final = {"stream": True, "stream_options": {}}  # counted, never asked
USAGE_11_3: Final = {"prompt_tokens": 11.0, "completion_tokens": 3.0}
# What the native reader counts of CHAT_EVENTS (the two that carry text), on every stream.
COUNTED_2: Final = {wire.USAGE_CONTENT_EVENTS: 2.0}
USAGE_7_5: Final = {"prompt_tokens": 7.0, "completion_tokens": 5.0}

# (case, key, request, the usage both arms must log). Chunkings whose results the Lua
# filter gets exactly: whole events per chunk, or the whole body in one.
SAME: Final = [
    ("json answer, split at its objects' ends", OPEN_KEY, chat("json events"), USAGE_7_5),
    ("json answer in one chunk, metered", METERED_KEY, chat("json one"), USAGE_7_5),
    ("json answer split at 3 bytes", OPEN_KEY, chat("json split-3"), USAGE_7_5),
    ("stream, usage asked by the client", OPEN_KEY, chat("chat events", **ASKED), USAGE_11_3),
    ("stream, usage asked by the gateway and cut", OPEN_KEY, chat("chat events", **NOT_ASKED),
     USAGE_11_3),
    ("stream, cut, one chunk", OPEN_KEY, chat("chat one", **NOT_ASKED), USAGE_11_3),
    ("stream, cut, events split at 7 bytes", OPEN_KEY, chat("chat split-7", **NOT_ASKED),
     USAGE_11_3),
    ("stream, CRLF lines, cut", OPEN_KEY, chat("chat events crlf", **NOT_ASKED), USAGE_11_3),
    ("stream, counted, no usage", METERED_KEY, chat("chat events", **NO_INJECTION),
     {wire.USAGE_CONTENT_EVENTS: 2.0}),
    ("stream, counted and cut", METERED_KEY, chat("chat events", **NOT_ASKED),
     {**USAGE_11_3, wire.USAGE_CONTENT_EVENTS: 2.0}),
]  # fmt: skip


@pytest.mark.parametrize(("key", "request_body", "usage"), [case[1:] for case in SAME],
                         ids=[case[0] for case in SAME])  # fmt: skip
async def test_the_native_reader_logs_and_passes_what_envoys_readers_do(
    arms: Arms, key: str, request_body: dict[str, Any], usage: dict[str, Any]
) -> None:
    envoy = await exchange(arms, "envoy", request_body, key)
    native = await exchange(arms, "native", request_body, key)
    assert envoy.status == native.status == 200
    assert envoy.usage == usage
    assert native.usage == ({**usage, **COUNTED_2} if request_body.get("stream") else usage)
    assert native.body == envoy.body
    if request_body.get("stream") and "stream_options" not in request_body:
        assert b'"usage"' not in native.body.replace(b'\\"usage\\"', b"")  # the event was cut


async def test_a_split_stream_is_counted_exactly(arms: Arms) -> None:
    """Events cut every 5 bytes: the Lua filter counts per chunk (a line in two chunks may
    count twice or not at all); the native reader counts each line once."""
    native = await exchange(arms, "native", chat("chat split-5", **NO_INJECTION), METERED_KEY)
    assert native.usage == {wire.USAGE_CONTENT_EVENTS: 2.0}


async def test_cr_line_ends_are_events_too(arms: Arms) -> None:
    """Lines ended by a lone CR (the SSE spec allows it): the usage event is read and cut."""
    plain = await exchange(arms, "native", chat("chat events", **NO_INJECTION), OPEN_KEY)
    native = await exchange(arms, "native", chat("chat events cr", **NOT_ASKED), OPEN_KEY)
    assert native.usage == {**USAGE_11_3, **COUNTED_2}
    assert native.body == plain.body.replace(b"\n", b"\r")


async def test_a_large_final_event_split_in_chunks_keeps_its_usage(arms: Arms) -> None:
    """A Responses API stream's `response.completed` repeats the whole output; split in
    small chunks it exceeds sse_to_metadata's 8 KB event buffer, which drops it; the native
    reader holds no event."""
    native = await exchange(arms, "native", chat("responses split-512", stream=True), OPEN_KEY,
                            path="/v1/responses")  # fmt: skip
    assert native.status == 200
    assert native.usage == {"input_tokens": 5.0, "output_tokens": 2.0,
                            wire.USAGE_CONTENT_EVENTS: 1.0}  # fmt: skip


@pytest.mark.parametrize("chunking", ["events", "one"])
async def test_a_cut_stream_that_ends_mid_event_passes_its_last_bytes(
    arms: Arms, chunking: str
) -> None:
    """A stream to cut whose provider stops before its usage event, in the middle of an
    event (no blank line, no [DONE]): the cut holds that event until the end, then passes
    it, once. The body is chunked, so Envoy's HTTP/1 codec ends it with an empty data
    frame: the filter's last take has no push before it (it once sent the held bytes
    twice). The Lua filter loses those bytes (its carry is never sent), so the bodies are
    not compared whole: the native arm's is all the provider sent, the Lua's stops before
    the unended event."""
    request_body = chat(f"unended {chunking}", **NOT_ASKED)
    envoy = await exchange(arms, "envoy", request_body, OPEN_KEY)
    native = await exchange(arms, "native", request_body, OPEN_KEY)
    assert envoy.status == native.status == 200
    assert envoy.usage == {}
    assert native.usage == COUNTED_2
    sent = "".join(event + "\n\n" for event in CHAT_EVENTS).encode()
    assert native.body == sent + UNENDED_TAIL
    assert envoy.body == sent  # the Lua's loss


@pytest.mark.parametrize("key", [METERED_KEY, OPEN_KEY], ids=["reserved", "not reserved"])
async def test_a_stream_the_client_leaves_keeps_its_count(arms: Arms, key: str) -> None:
    """The count is written once, at the stream's end; a stream that has none (its client
    leaves midway, Envoy resets it) gets it when Envoy completes the stream, before it
    logs it: the two events with text it passed (without the hook: no count at all)."""
    request_id = f"native-left-{key[-6:]}-{time.monotonic_ns()}"
    headers = {RECORD_ID: request_id, "authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session:
        response = await session.post(arms.urls["native"] + "/v1/chat/completions",
                                      json=chat(ENDLESS, **NOT_ASKED), headers=headers)  # fmt: skip
        received = b""
        while received.count(b"\n\n") < 3:  # the role event and the two with text
            received += await asyncio.wait_for(response.content.readany(), timeout=10)
        response.close()  # leaves, the stream unended
    entry = await arms.collector.entry(request_id)
    assert entry.metadata.get(wire.USAGE_METADATA_NAMESPACE, {}) == COUNTED_2
