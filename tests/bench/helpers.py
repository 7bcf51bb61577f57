"""What the bench's tests share: a distinctive key, a fixed upstream in a thread of its
own, and the command run as a user runs it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from concurrent.futures import Future

from sluicegate.bench.fixed_upstream import FixedUpstream, Options, start_fixed_upstream
from sluicegate.bench.loops import new_event_loop

# Distinctive, so a test can grep every output for it.
SECRET = "sk-bench-SECRET-8f3a1c77e2"


class ThreadedUpstream:
    """A fixed upstream on its own loop in a thread."""

    def __init__(self, options: Options) -> None:
        self._ready: Future[FixedUpstream] = Future()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, args=(options,), daemon=True)
        self._thread.start()
        self._upstream = self._ready.result(timeout=10)
        self.url = self._upstream.url

    def _run(self, options: Options) -> None:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(self._serve(options))

    async def _serve(self, options: Options) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        upstream = await start_fixed_upstream(options)
        self._ready.set_result(upstream)
        try:
            await self._stop.wait()
        finally:
            await upstream.close()

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)


def bench(*args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`sluicegate bench ARGS` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "sluicegate", "bench", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
