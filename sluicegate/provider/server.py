"""Starting and stopping a mock provider: in the caller's event loop, or blocking (CLI)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import sys
from typing import Any

from aiohttp import web

from sluicegate.provider.app import build_app
from sluicegate.provider.settings import MockProviderSettings
from sluicegate.provider.state import ProviderState

log = logging.getLogger(__name__)

# In-flight requests get this long to finish when the server closes; hung and long
# streaming requests are then cancelled, so close() stays fast in tests.
SHUTDOWN_GRACE_S = 0.5


class RunningMockProvider:
    """A mock provider serving in the current event loop; `await close()` when done."""

    def __init__(
        self,
        state: ProviderState,
        runner: web.AppRunner,
        server: asyncio.Server,
        port: int,
    ) -> None:
        self._state = state
        self._runner = runner
        self._server = server
        self.port = port
        scheme = "https" if state.settings.tls else "http"
        host = state.settings.host
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        self.url = f"{scheme}://{host}:{port}"
        self._closed = False

    @property
    def name(self) -> str:
        return self._state.settings.name

    @property
    def settings(self) -> MockProviderSettings:
        """The current settings (including changes made through configure or /mock/config)."""
        return self._state.settings

    def stats(self) -> dict[str, Any]:
        """Same JSON as GET /mock/stats."""
        return self._state.stats_snapshot()

    def reset_stats(self) -> None:
        self._state.stats.reset()

    def configure(self, **changes: Any) -> MockProviderSettings:
        """Change rates/latencies at runtime, like POST /mock/config; ValueError if invalid."""
        return self._state.configure(changes)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._state.closing.set()
        self._server.close()  # stop accepting first, then drain/cancel what is in flight
        await self._runner.cleanup()
        # On 3.12+ wait_closed() also waits for connections, which cleanup() has closed.
        await self._server.wait_closed()

    async def __aenter__(self) -> RunningMockProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _ssl_context(settings: MockProviderSettings) -> ssl.SSLContext | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    # Envoy negotiates h2 over ALPN when offered; aiohttp only speaks HTTP/1.1.
    context.set_alpn_protocols(["http/1.1"])
    return context


async def start_mock_provider(settings: MockProviderSettings) -> RunningMockProvider:
    """Serve `settings` on its host/port (0 = a free port) in the running event loop."""
    state = ProviderState(settings)
    runner = web.AppRunner(
        build_app(state),
        handle_signals=False,
        access_log=None,  # per-request logging would dominate the cost under benchmarks
        # Stop generating when the client goes away, as real providers do; this is also what
        # ends a 'hang' fault as soon as the client gives up.
        handler_cancellation=True,
        keepalive_timeout=settings.keepalive_timeout_s,
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    await runner.setup()
    http_server = runner.server
    assert http_server is not None
    state.server = http_server

    # Our own protocol factory (rather than a TCPSite) so every accepted TCP connection is
    # counted: tests use connections_total to check that Envoy keeps connections alive.
    def protocol_factory() -> asyncio.Protocol:
        state.stats.connection_opened()
        return http_server()

    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(
            protocol_factory,
            settings.host,
            settings.port,
            ssl=_ssl_context(settings),
            reuse_address=True,
            backlog=1024,
        )
    except BaseException:
        await runner.cleanup()
        raise
    port = int(server.sockets[0].getsockname()[1])
    return RunningMockProvider(state, runner, server, port)


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def _serve_until_signalled(settings: MockProviderSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # Windows
            loop.add_signal_handler(signum, stop.set)
    provider = await start_mock_provider(settings)
    try:
        # One parseable line on stdout: a parent that asked for port 0 learns the port here.
        print(
            f"mock provider {settings.name!r} listening on {provider.url}",
            file=sys.stdout,
            flush=True,
        )
        await stop.wait()
        log.info("mock provider %s shutting down", settings.name)
    finally:
        await provider.close()


def run_mock_provider(settings: MockProviderSettings) -> None:
    """Serve until SIGINT/SIGTERM (blocking; uses uvloop when available)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(_serve_until_signalled(settings))
