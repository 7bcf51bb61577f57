"""A minimal HTTP/1.1 client over asyncio, so the bench is not what limits a run.

One request at a time per connection, kept alive between requests; bodies by
Content-Length, chunked, or up to the close; a streamed answer is handed to the SSE
reader piece by piece with the time each piece arrived. Only the response headers the
bench reads are kept. aiohttp's client did the same work at about a third of the
requests/s (docs/bench.md, "How fast the bench is").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from typing import Final, cast

from sluicegate.bench.sse import StreamReader

# Ways a request can fail without an HTTP answer (Sample.kind values).
CONNECTION: Final = "connection"  # could not connect, or the connection died before any answer
TIMEOUT: Final = "timeout"  # --timeout passed
INCOMPLETE: Final = "incomplete"  # the answer started, then the connection died
BAD_RESPONSE: Final = "bad_response"  # not HTTP/1.x, or a body framing error

_NO_BODY, _LENGTH, _CHUNKED, _UNTIL_CLOSE = 0, 1, 2, 3
_SIZE_LINE, _CHUNK_END, _TRAILERS = -1, -2, -3
_EVENT_STREAM: Final = "text/event-stream"
_perf_counter = time.perf_counter


class Exchange:
    """One request's answer as it arrives; `waiter` resolves when it is complete or failed."""

    __slots__ = (
        "_parts",
        "body",
        "end",
        "error",
        "headers",
        "reader",
        "status",
        "waiter",
    )  # fmt: skip

    def __init__(self, waiter: asyncio.Future[None]) -> None:
        self.waiter = waiter
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""  # a non-streamed answer's body (streams go to `reader`)
        self.reader: StreamReader | None = None
        self.error: str | None = None  # one of the kinds above
        self.end = 0.0  # when the last byte arrived
        self._parts: list[bytes] = []

    def _feed(self, piece: bytes, now: float) -> None:
        if self.reader is not None:
            self.reader.feed(piece, now)
        else:
            self._parts.append(piece)

    def _finish(self, now: float, error: str | None) -> None:
        if self.waiter.done():
            return
        self.end = now
        self.error = error
        if self._parts:
            self.body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self._parts = []
        self.waiter.set_result(None)


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection. `wanted`: lower-case names of the response
    headers to keep (content-type is always kept)."""

    def __init__(self, wanted: frozenset[bytes]) -> None:
        self._wanted = wanted | {b"content-type"}
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._exchange: Exchange | None = None
        self._in_head = True
        self._mode = _NO_BODY
        self._left = 0  # bytes of the body (or of the chunk) still to come
        self._keep_alive = True
        self._received = False
        self.closed = False

    # ---- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Requests are written whole: never wait to coalesce them (Nagle).
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        now = _perf_counter()
        exchange = self._exchange
        if exchange is None:
            self._abort()  # bytes nobody asked for: the connection cannot be trusted
            return
        self._received = True
        if self._in_head:
            self._buffer += data
            if not self._read_head(exchange):
                return
            if self._exchange is None:
                return
            data = bytes(self._buffer)
            self._buffer.clear()
            if not data:
                if (self._mode == _LENGTH and self._left == 0) or self._mode == _NO_BODY:
                    self._complete(exchange, now)
                return
        self._read_body(exchange, data, now)

    def eof_received(self) -> bool:
        return False  # close; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange, self._exchange = self._exchange, None
        if exchange is None:
            return
        now = _perf_counter()
        if not self._in_head and self._mode == _UNTIL_CLOSE:
            exchange._finish(now, None)
        else:
            exchange._finish(now, INCOMPLETE if self._received else CONNECTION)

    # ---- the client's side -------------------------------------------------------------

    def send(self, data: bytes, exchange: Exchange) -> None:
        """Write one request; its answer fills `exchange`."""
        transport = self._transport
        if self.closed or transport is None or transport.is_closing():
            exchange._finish(_perf_counter(), CONNECTION)
            return
        self._exchange = exchange
        self._in_head = True
        self._received = False
        transport.write(data)

    def expire(self) -> None:
        """The request's time is up: fail it as a timeout and drop the connection."""
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange._finish(_perf_counter(), TIMEOUT)
        self._abort()

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    @property
    def idle(self) -> bool:
        return self._exchange is None and not self.closed

    # ---- parsing -----------------------------------------------------------------------

    def _read_head(self, exchange: Exchange) -> bool:
        """Parse the status line and headers once all are in; False while they are not."""
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > 256 * 1024:
                    self._fail(exchange, BAD_RESPONSE)
                return False
            head = bytes(buffer[:end])
            del buffer[: end + 4]
            lines = head.split(b"\r\n")
            status_line = lines[0]
            if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12:
                self._fail(exchange, BAD_RESPONSE)
                return False
            try:
                status = int(status_line[9:12])
            except ValueError:
                self._fail(exchange, BAD_RESPONSE)
                return False
            if 100 <= status < 200:
                continue  # 100 Continue and the like: the real answer follows
            break
        keep_alive = status_line[7:8] == b"1"
        length = -1
        chunked = False
        wanted = self._wanted
        headers = exchange.headers
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    self._fail(exchange, BAD_RESPONSE)
                    return False
            elif name == b"transfer-encoding":
                chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"connection":
                token = value.strip().lower()
                keep_alive = token != b"close" and (keep_alive or token == b"keep-alive")
            elif name in wanted:
                headers[name.decode("latin-1")] = value.strip().decode("latin-1")
        exchange.status = status
        self._keep_alive = keep_alive
        if status in (204, 304):
            self._mode = _NO_BODY
        elif chunked:
            self._mode, self._left = _CHUNKED, _SIZE_LINE
        elif length >= 0:
            self._mode, self._left = _LENGTH, length
        else:
            self._mode, self._keep_alive = _UNTIL_CLOSE, False
        if status == 200 and headers.get("content-type", "").startswith(_EVENT_STREAM):
            exchange.reader = StreamReader()
        self._in_head = False
        return True

    def _read_body(self, exchange: Exchange, data: bytes, now: float) -> None:
        mode = self._mode
        if mode == _LENGTH:
            left = self._left
            if len(data) >= left:
                if left:
                    exchange._feed(data[:left] if len(data) > left else data, now)
                self._left = 0
                self._complete(exchange, now)
            else:
                exchange._feed(data, now)
                self._left = left - len(data)
        elif mode == _CHUNKED:
            self._buffer += data
            self._read_chunks(exchange, now)
        elif mode == _UNTIL_CLOSE:
            exchange._feed(data, now)
        else:
            self._complete(exchange, now)

    def _read_chunks(self, exchange: Exchange, now: float) -> None:
        buffer = self._buffer
        while buffer:
            left = self._left
            if left > 0:
                piece = bytes(buffer[:left])
                del buffer[:left]
                self._left = left - len(piece)
                if self._left == 0:
                    self._left = _CHUNK_END
                exchange._feed(piece, now)
            elif left == _CHUNK_END:
                if len(buffer) < 2:
                    return
                if buffer[:2] != b"\r\n":
                    self._fail(exchange, BAD_RESPONSE)
                    return
                del buffer[:2]
                self._left = _SIZE_LINE
            elif left == _SIZE_LINE:
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                try:
                    size = int(bytes(buffer[:end]).split(b";", 1)[0], 16)
                except ValueError:
                    self._fail(exchange, BAD_RESPONSE)
                    return
                del buffer[: end + 2]
                self._left = size if size > 0 else _TRAILERS
            else:  # trailers: lines up to an empty one
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                del buffer[: end + 2]
                if end == 0:
                    self._complete(exchange, now)
                    return

    def _complete(self, exchange: Exchange, now: float) -> None:
        self._exchange = None
        self._buffer.clear()
        if not self._keep_alive:
            self.close()
        exchange._finish(now, None)

    def _fail(self, exchange: Exchange, error: str) -> None:
        self._exchange = None
        exchange._finish(_perf_counter(), error)
        self._abort()

    def _abort(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()


async def connect(
    host: str, port: int, wanted: frozenset[bytes], context: ssl.SSLContext | None
) -> Connection:
    """A new connection; OSError (refused, unreachable, TLS) propagates."""
    loop = asyncio.get_running_loop()
    server_hostname = host if context is not None else None
    _, protocol = await loop.create_connection(
        lambda: Connection(wanted), host, port, ssl=context, server_hostname=server_hostname
    )
    return protocol
