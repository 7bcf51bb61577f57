"""A fixed-answer OpenAI-compatible upstream, much faster than the mock provider: for
measuring the bench's own ceiling, and as the upstream of comparisons whose subject
must be the only bottleneck.

    python -m sluicegate.bench.fixed_upstream --port P [--stream-chunks N
        --chunk-interval-ms X] [--latency-ms L] [--max-inflight K] [--workers W]

`POST .../chat/completions` (or `.../completions`) gets one chat completion with N
output tokens, as JSON, or streamed when the body asks (`"stream": true`): N content
events X ms apart after L ms, the usage event when `stream_options.include_usage` is
asked, and `[DONE]`. `GET .../models` lists the one model. Above K requests in progress
it answers 429 (`rate_limit_exceeded`, `Retry-After: 1`) at once: a provider with a
concurrency limit, whose capacity a sweep finds exactly. HTTP/1.1 keep-alive, bodies by
Content-Length or chunked. Nothing is read from the body but those two flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from sluicegate.bench.loops import die_with_parent, new_event_loop

_STREAM: Final = re.compile(rb'"stream"\s*:\s*true')
_INCLUDE_USAGE: Final = re.compile(rb'"include_usage"\s*:\s*true')


@dataclass(frozen=True)
class Options:
    host: str = "127.0.0.1"
    port: int = 0
    model: str = "fixed"
    output_tokens: int = 16
    stream_chunks: int | None = None  # default: output_tokens
    chunk_interval_ms: float = 0.0
    latency_ms: float = 0.0
    max_inflight: int | None = None
    workers: int = 1


class _Answers:
    """Every byte the server sends, made once."""

    def __init__(self, options: Options) -> None:
        chunks = options.stream_chunks or options.output_tokens
        text = "".join(f"tok{i} " for i in range(1, options.output_tokens + 1))
        usage = {"prompt_tokens": 8, "completion_tokens": options.output_tokens,
                 "total_tokens": 8 + options.output_tokens}  # fmt: skip
        chat = {
            "id": "chatcmpl-fixed", "object": "chat.completion", "created": 1_700_000_000,
            "model": options.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": usage,
        }  # fmt: skip
        self.json = _response(200, "application/json", _dumps(chat))
        models = {"object": "list", "data": [{"id": options.model, "object": "model",
                                              "created": 0, "owned_by": "fixed"}]}  # fmt: skip
        self.models = _response(200, "application/json", _dumps(models))
        error = {"error": {"message": "over the fixed upstream's --max-inflight",
                           "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
        self.refused = _response(429, "application/json", _dumps(error), b"Retry-After: 1\r\n")
        missing = {"error": {"message": "unknown path", "type": "invalid_request_error",
                             "param": None, "code": "unknown_url"}}  # fmt: skip
        self.not_found = _response(404, "application/json", _dumps(missing))
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        head = {"id": "chatcmpl-fixed", "object": "chat.completion.chunk",
                "created": 1_700_000_000, "model": options.model}  # fmt: skip
        per_chunk = max(1, options.output_tokens // chunks)
        self.chunks = [
            _chunk(_event({**head, "choices": [{"index": 0, "finish_reason": None,
                                                "delta": {"content": "tok " * per_chunk}}]}))
            for _ in range(chunks)
        ]  # fmt: skip
        self.finish = _chunk(_event({**head, "choices": [{"index": 0, "delta": {},
                                                          "finish_reason": "stop"}]}))
        self.usage = _chunk(_event({**head, "choices": [], "usage": usage}))
        self.done = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _event(payload: Any) -> bytes:
    return b"data: " + _dumps(payload) + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _response(status: int, content_type: str, body: bytes, extra: bytes = b"") -> bytes:
    reason = {200: b"OK", 404: b"Not Found", 429: b"Too Many Requests"}[status]
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
        % (status, reason, content_type.encode(), len(body), extra)
    ) + body


class _State:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.answers = _Answers(options)
        self.inflight = 0
        self.requests = 0


class _Server(asyncio.Protocol):
    """One client connection: requests answered one after another."""

    def __init__(self, state: _State) -> None:
        self._state = state
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._pending: list[tuple[bytes, bytes, bytes]] = []
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            request = self._next_request()
            if request is None:
                return
            if self._busy:
                self._pending.append(request)
            else:
                self._answer(*request)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def _next_request(self) -> tuple[bytes, bytes, bytes] | None:
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(buffer[:end])
        lower = head.lower()
        method, _, rest = head.partition(b" ")
        path = rest.partition(b" ")[0]
        start = end + 4
        if b"transfer-encoding: chunked" in lower or b"transfer-encoding:chunked" in lower:
            body = self._chunked_body(start)
            if body is None:
                return None
            return method, path, body
        match = re.search(rb"content-length:\s*(\d+)", lower)
        length = int(match.group(1)) if match else 0
        if len(buffer) < start + length:
            return None
        body = bytes(buffer[start : start + length])
        del buffer[: start + length]
        return method, path, body

    def _chunked_body(self, start: int) -> bytes | None:
        buffer = self._buffer
        position, parts = start, list[bytes]()
        while True:
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                return None
            size = int(bytes(buffer[position:line_end]).split(b";")[0], 16)
            position = line_end + 2
            if size == 0:
                trailer_end = buffer.find(b"\r\n", position)
                if trailer_end < 0:
                    return None
                del buffer[: trailer_end + 2]
                return b"".join(parts)
            if len(buffer) < position + size + 2:
                return None
            parts.append(bytes(buffer[position : position + size]))
            position += size + 2

    def _answer(self, method: bytes, path: bytes, body: bytes) -> None:
        state, transport = self._state, self._transport
        if transport is None:
            return
        answers = state.answers
        state.requests += 1
        if method == b"GET" and path.rstrip(b"/").endswith(b"/models"):
            transport.write(answers.models)
            return
        if method != b"POST" or not path.endswith(b"completions"):
            transport.write(answers.not_found)
            return
        limit = state.options.max_inflight
        if limit is not None and state.inflight >= limit:
            transport.write(answers.refused)
            return
        stream = _STREAM.search(body) is not None
        latency = state.options.latency_ms / 1000
        if not stream and latency <= 0:
            transport.write(answers.json)
            return
        state.inflight += 1
        self._busy = True
        loop = asyncio.get_running_loop()
        due = time.monotonic() + latency
        if stream:
            usage = _INCLUDE_USAGE.search(body) is not None
            loop.call_later(latency, self._stream_step, 0, usage, due)
        else:
            loop.call_later(latency, self._json_later, due)

    @staticmethod
    def _early(due: float, then: Callable[..., None], *args: object) -> bool:
        """Whether a timer fired before `due` (uvloop's clock counts whole milliseconds, so
        a timer may fire up to one early): `then(*args)` is called again at `due`. An
        answer never comes before its latency."""
        left = due - time.monotonic()
        if left <= 0:
            return False
        asyncio.get_running_loop().call_later(left, then, *args)
        return True

    def _json_later(self, due: float) -> None:
        if self._early(due, self._json_later, due):
            return
        if self._transport is not None:
            self._transport.write(self._state.answers.json)
        self._done()

    def _stream_step(self, index: int, usage: bool, due: float) -> None:
        if self._early(due, self._stream_step, index, usage, due):
            return
        transport, answers = self._transport, self._state.answers
        if transport is None:
            self._done()
            return
        interval = self._state.options.chunk_interval_ms / 1000
        if index == 0:
            transport.write(answers.stream_head)
        while index < len(answers.chunks):
            transport.write(answers.chunks[index])
            index += 1
            if interval > 0 and index < len(answers.chunks):
                # Absolute deadlines: a late timer does not push every later chunk back.
                due += interval
                delay = max(0.0, due - time.monotonic())
                asyncio.get_running_loop().call_later(delay, self._stream_step, index, usage, due)
                return
        transport.write(answers.finish + (answers.usage if usage else b"") + answers.done)
        self._done()

    def _done(self) -> None:
        self._state.inflight -= 1
        self._busy = False
        if self._pending:
            self._answer(*self._pending.pop(0))


class FixedUpstream:
    """A fixed upstream serving in the current event loop; `await close()` when done."""

    def __init__(self, server: asyncio.Server, state: _State, port: int) -> None:
        self._server = server
        self._state = state
        self.port = port
        self.url = f"http://{state.options.host}:{port}"

    @property
    def requests(self) -> int:
        return self._state.requests

    async def close(self) -> None:
        self._server.close()
        close_clients = getattr(self._server, "close_clients", None)  # 3.13+
        if close_clients is not None:
            close_clients()
        await self._server.wait_closed()


async def start_fixed_upstream(
    options: Options, sock: socket.socket | None = None
) -> FixedUpstream:
    """Serve in the running event loop, on `sock` or on options.host and .port."""
    state = _State(options)
    loop = asyncio.get_running_loop()
    if sock is not None:
        server = await loop.create_server(lambda: _Server(state), sock=sock, backlog=4096)
    else:
        server = await loop.create_server(
            lambda: _Server(state), options.host, options.port, reuse_address=True, backlog=4096
        )
    port = int(server.sockets[0].getsockname()[1])
    return FixedUpstream(server, state, port)


def _listening_socket(options: Options) -> socket.socket:
    """One listening socket that every worker inherits, so port 0 gives them one port."""
    sock = socket.socket(socket.AF_INET6 if ":" in options.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((options.host, options.port))
    sock.listen(4096)
    sock.setblocking(False)
    return sock


async def _serve(options: Options, sock: socket.socket, announce: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    upstream = await start_fixed_upstream(options, sock)
    if announce:
        print(f"fixed upstream listening on {upstream.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await upstream.close()


def _run_worker(options: Options, sock: socket.socket, announce: bool) -> None:
    die_with_parent()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(_serve(options, sock, announce))


def serve(options: Options) -> None:
    """Serve until SIGINT/SIGTERM; with `workers` > 1, that many processes share the
    socket (the first line on stdout names the URL)."""
    sock = _listening_socket(options)
    if options.workers <= 1:
        _run_worker(options, sock, announce=True)
        return
    context = multiprocessing.get_context("fork")  # before any loop: forking is safe here
    processes = [
        context.Process(target=_run_worker, args=(options, sock, index == 0), daemon=True)
        for index in range(options.workers)
    ]
    for process in processes:
        process.start()
    stop = [False]

    def _stop(signum: int, frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop[0] and all(p.is_alive() for p in processes):
        time.sleep(0.2)
    for process in processes:
        if process.is_alive() and process.pid is not None:
            process.terminate()
        process.join(timeout=5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sluicegate.bench.fixed_upstream",
        description=(__doc__ or "").split("\n\n")[0],
    )
    d = Options()
    parser.add_argument("--host", default=d.host)
    parser.add_argument("--port", type=int, default=d.port, help="0: any free port")
    parser.add_argument("--model", default=d.model, help="the one model listed and answered")
    parser.add_argument("--output-tokens", type=int, default=d.output_tokens)
    parser.add_argument("--stream-chunks", type=int, help="content events per stream "
                        "(default: --output-tokens)")  # fmt: skip
    parser.add_argument("--chunk-interval-ms", type=float, default=0.0)
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="before the answer (the first event of a stream)")  # fmt: skip
    parser.add_argument("--max-inflight", type=int, help="answer 429 above this many requests "
                        "in progress (per worker)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    args = parser.parse_args(argv)
    for flag, value in (("--output-tokens", args.output_tokens), ("--workers", args.workers),
                        ("--stream-chunks", args.stream_chunks or 1),
                        ("--max-inflight", 1 if args.max_inflight is None else args.max_inflight)):
        if value < 1:
            parser.error(f"{flag} must be >= 1")
    if args.chunk_interval_ms < 0 or args.latency_ms < 0:
        parser.error("--chunk-interval-ms and --latency-ms must be >= 0")
    serve(Options(args.host, args.port, args.model, args.output_tokens, args.stream_chunks,
                  args.chunk_interval_ms, args.latency_ms, args.max_inflight, args.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
