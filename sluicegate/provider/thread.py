"""A mock provider on its own event loop in a background thread, for synchronous callers
(benchmarks, tests that drive Envoy through blocking clients)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from sluicegate.provider.server import RunningMockProvider, new_event_loop, start_mock_provider
from sluicegate.provider.settings import MockProviderSettings

_T = TypeVar("_T")
_TIMEOUT_S = 10.0


class ThreadedMockProvider:
    """Starts serving on construction; use as a context manager or call close().

    The provider's counters live on its own loop, so every accessor hops onto that loop.
    """

    def __init__(self, settings: MockProviderSettings) -> None:
        self._ready: Future[RunningMockProvider] = Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(
            target=self._run, args=(settings,), name=f"mock-provider-{settings.name}", daemon=True
        )
        self._thread.start()
        self._provider = self._ready.result(timeout=_TIMEOUT_S)
        self.port: int = self._provider.port
        self.url: str = self._provider.url

    def _run(self, settings: MockProviderSettings) -> None:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(self._serve(settings))

    async def _serve(self, settings: MockProviderSettings) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            provider = await start_mock_provider(settings)
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._ready.set_result(provider)
        try:
            await self._stop.wait()
        finally:
            await provider.close()

    def _in_loop(self, fn: Callable[[], _T]) -> _T:
        assert self._loop is not None
        result: Future[_T] = Future()

        def call() -> None:
            try:
                result.set_result(fn())
            except BaseException as exc:
                result.set_exception(exc)

        self._loop.call_soon_threadsafe(call)
        return result.result(timeout=_TIMEOUT_S)

    @property
    def name(self) -> str:
        return self._provider.name

    def stats(self) -> dict[str, Any]:
        return self._in_loop(self._provider.stats)

    def reset_stats(self) -> None:
        self._in_loop(self._provider.reset_stats)

    def configure(self, **changes: Any) -> MockProviderSettings:
        return self._in_loop(lambda: self._provider.configure(**changes))

    def close(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=_TIMEOUT_S)

    def __enter__(self) -> ThreadedMockProvider:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def start_mock_provider_thread(settings: MockProviderSettings) -> ThreadedMockProvider:
    """Serve `settings` from a background thread (own uvloop); returns once listening."""
    return ThreadedMockProvider(settings)
