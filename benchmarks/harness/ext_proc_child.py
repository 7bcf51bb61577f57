"""An ExtProcServer in a process of its own (spawned, on uvloop as in production), so
that its CPU is read from /proc apart from the load generator's.

`build` runs in the child and returns the server to start; it must be a module-level
function (spawn pickles it by name), and so must its arguments be picklable.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any

from sluicegate.filters import ExtProcServer

START_TIMEOUT_S = 30.0


def _serve(
    build: Callable[..., ExtProcServer], args: tuple[Any, ...], ready: Any, stop: Any
) -> None:
    import uvloop

    async def main() -> None:
        server = build(*args)
        address = await server.start("127.0.0.1:0")
        ready.put((address, os.getpid()))
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await server.stop(0)

    uvloop.run(main())


class ExtProcChild:
    """Started at once; `wait_ready()` gives its address and pid (several children can
    start together and boot in parallel); `stop()` ends it, killing it if it must."""

    def __init__(self, build: Callable[..., ExtProcServer], *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready = context.Queue()
        self._stop = context.Event()
        self.process = context.Process(
            target=_serve, args=(build, args, self._ready, self._stop), daemon=True
        )
        self.process.start()
        self.address = ""
        self.pid = 0

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> ExtProcChild:
        self.address, self.pid = self._ready.get(timeout=timeout_s)
        return self

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def signal_stop(self) -> None:
        self._stop.set()

    def stop(self) -> list[int]:
        """Stop it; the PIDs that had to be killed (empty when the stop was clean)."""
        self._stop.set()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
            return [self.process.pid or 0]
        return []

    def __enter__(self) -> ExtProcChild:
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def stop_all(children: list[ExtProcChild]) -> list[int]:
    """Signal every child first, so they stop in parallel, then join each."""
    for child in children:
        child.signal_stop()
    killed: list[int] = []
    for child in children:
        killed += child.stop()
    return killed
