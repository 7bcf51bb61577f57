"""A provider whose every answer shape is chosen by the request, for the charge matrix and
the hostile-input tests: a real aiohttp server on 127.0.0.1 in a thread of the test process.

The mock provider (sluicegate/provider) has no knob for a JSON answer's content-type
parameters or a plain-text error body, so these tests script their own. The request header
`x-test-answer` names the shape (ANSWERS); `x-test-content-type` overrides a JSON answer's
content type; `x-test-status` an error's status.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from aiohttp import web

ANSWER_HEADER: Final = "x-test-answer"
CONTENT_TYPE_HEADER: Final = "x-test-content-type"
STATUS_HEADER: Final = "x-test-status"

# What every usage-bearing answer says it cost.
PROMPT_TOKENS: Final = 5
COMPLETION_TOKENS: Final = 1
# Content chunks of a stream (each one token when counted).
CONTENT_CHUNKS: Final = 3
PLAIN_ERROR_TEXT: Final = 'upstream says no: "quota" \\ exceeded\n'


def _usage() -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
    }


def _chunk(content: str | None, *, usage: bool = False, end: bytes = b"\n\n") -> bytes:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}}]
    event: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "choices": choices}
    if usage:
        event["usage"] = _usage()
    return b"data: " + json.dumps(event).encode() + end


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


async def _stream(request: web.Request, events: list[bytes], *, cut: bool = False,
                  hang: bool = False) -> web.StreamResponse:  # fmt: skip
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
        if not event.endswith(b"\n"):  # half an event: its rest comes in another read
            await asyncio.sleep(0.05)
    if hang:
        await asyncio.sleep(3600)  # until the client (through Envoy) goes away
    if cut:
        transport = request.transport
        assert transport is not None
        transport.abort()  # the provider dies mid-stream
        raise asyncio.CancelledError
    await response.write_eof()
    return response


async def _answer(request: web.Request) -> web.StreamResponse:
    await request.read()
    shape = request.headers.get(ANSWER_HEADER, "json")
    content_type = request.headers.get(CONTENT_TYPE_HEADER, "application/json")
    status = int(request.headers.get(STATUS_HEADER, "400"))
    completion = {
        "id": "c1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    }
    contents = [_chunk(f"t{i}") for i in range(CONTENT_CHUNKS)]
    if shape == "json":
        body = json.dumps({**completion, "usage": _usage()})
        return web.Response(body=body.encode(), headers={"content-type": content_type})
    if shape == "json-no-usage":
        return web.Response(body=json.dumps(completion).encode(), content_type="application/json")
    if shape == "json-malformed":
        return web.Response(
            body=b'{"id": "c1", "usage": {"prompt_', content_type="application/json"
        )
    if shape == "sse-usage":
        return await _stream(request, [*contents, _chunk(None, usage=True), b"data: [DONE]\n\n"])
    if shape == "sse":
        return await _stream(request, [*contents, b"data: [DONE]\n\n"])
    # The usage event split across two writes, or on the last content event (choices and
    # usage together, as some providers send it), or with CRLF line ends.
    if shape == "sse-usage-split":
        event = _chunk(None, usage=True)
        half = len(event) // 2
        return await _stream(request, [*contents, event[:half], event[half:], b"data: [DONE]\n\n"])
    if shape == "sse-usage-on-content":
        last = _chunk("t-last", usage=True)
        return await _stream(request, [*contents, last, b"data: [DONE]\n\n"])
    if shape == "sse-usage-on-content-and-asked":  # Groq-like extra usage, then OpenAI's
        last = _chunk("t-last", usage=True)
        return await _stream(
            request, [*contents, last, _chunk(None, usage=True), b"data: [DONE]\n\n"]
        )
    if shape == "sse-responses-cut":  # Responses API events, cut before the last one
        deltas = [
            _event({"type": "response.output_text.delta", "delta": f"t{i}"})
            for i in range(CONTENT_CHUNKS)
        ]
        done = _event({"type": "response.output_text.done", "text": "t0t1t2"})
        return await _stream(request, [*deltas, done], cut=True)
    if shape == "sse-tools-cut":  # text behind an empty `content`: reasoning, tool calls

        def delta(**members: Any) -> bytes:
            return _event({"id": "c1", "choices": [{"index": 0, "delta": members}]})

        def call(arguments: str) -> list[dict[str, Any]]:
            return [{"index": 0, "function": {"name": "f", "arguments": arguments}}]

        thought = delta(content="", reasoning_content="thinking")  # 1 event with text
        start = delta(role="assistant", content=None, tool_calls=call(""))  # none
        calls = [delta(content=None, tool_calls=call(f'{{"a{i}":')) for i in range(CONTENT_CHUNKS)]
        return await _stream(request, [thought, start, *calls], cut=True)
    if shape == "sse-empty":  # no event with text at all
        return await _stream(request, [b"data: [DONE]\n\n"])
    if shape == "sse-usage-whole":  # the stream in one body with its content-length
        body = b"".join([*contents, _chunk(None, usage=True), b"data: [DONE]\n\n"])
        return web.Response(body=body, headers={"content-type": "text/event-stream"})
    if shape == "sse-usage-crlf":
        crlf = [c.replace(b"\n\n", b"\r\n\r\n") for c in contents]
        usage = _chunk(None, usage=True, end=b"\r\n\r\n")
        return await _stream(request, [*crlf, usage, b"data: [DONE]\r\n\r\n"])
    if shape == "sse-malformed":
        return await _stream(request, [contents[0], b"data: {nope\n\n", b"data: \xff\n\n"])
    if shape == "sse-cut":
        return await _stream(request, contents, cut=True)
    if shape == "hang":  # nothing at all, until the client (through Envoy) goes away
        await asyncio.sleep(3600)
    if shape == "sse-hang":
        return await _stream(request, contents, hang=True)
    if shape == "error-json":
        error = {"error": {"message": "no", "type": "invalid_request_error", "param": None,
                           "code": "nope"}}  # fmt: skip
        return web.Response(status=status, body=json.dumps(error).encode(),
                            content_type="application/json")  # fmt: skip
    if shape == "error-text":
        return web.Response(status=status, text=PLAIN_ERROR_TEXT, headers={"retry-after": "3"})
    if shape == "error-empty":
        return web.Response(status=status)
    if shape == "impostor":  # a provider (or an upstream gateway) with the gateway's headers
        error = {"error": {"message": "slow down", "type": "requests", "param": None,
                           "code": "rate_limit_exceeded"}}  # fmt: skip
        return web.Response(
            status=429,
            body=json.dumps(error).encode(),
            content_type="application/json",
            headers={"x-sluicegate-refusal": "rate_limit_exceeded", "x-sluicegate-queue-ms": "999"},
        )
    if shape == "error-binary":
        return web.Response(status=status, body=b"\xff\xfe bad \x00 bytes",
                            content_type="application/octet-stream")  # fmt: skip
    return web.Response(status=599, text=f"unknown shape {shape}")


def provider_section(name: str, port: int) -> dict[str, Any]:
    """The config's provider entry for a scripted provider on `port`: its knobs must be
    forwarded (providers receive an allowlist of request headers)."""
    return {
        "name": name,
        "base_url": f"http://127.0.0.1:{port}/v1",
        "forward_headers": [ANSWER_HEADER, CONTENT_TYPE_HEADER, STATUS_HEADER],
    }


class ScriptedProvider:
    """The server and the base URL to give a provider's `base_url`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"


@contextmanager
def scripted_provider(port: int) -> Iterator[ScriptedProvider]:
    """Serve on 127.0.0.1:`port` until the block ends."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _answer)
    # Answers still hanging at the end (the `hang` shapes) are cancelled, not waited for.
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name="scripted-provider", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("scripted provider did not start")
    try:
        yield ScriptedProvider(port)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
