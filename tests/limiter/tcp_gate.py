"""A TCP relay in front of a real redis-server that lets the first N connections through
and holds every later one open without relaying a byte: "Redis answers the connections
it has, new ones hang", as when a replica's burst opens connections faster than a
loaded machine completes them."""

from __future__ import annotations

import asyncio
import contextlib


class TcpGate:
    def __init__(self, target_port: int, admit: int) -> None:
        self._target_port = target_port
        self._admit = admit
        self._accepted = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    def open(self) -> None:
        """Relay every connection from now on (those held stay held)."""
        self._admit = self._accepted + 1_000_000

    async def __aenter__(self) -> TcpGate:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        self._accepted += 1
        if self._accepted > self._admit:
            return  # held: the client's handshake is never answered
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        self._writers.append(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(_pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    sink.close()
