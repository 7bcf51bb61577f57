"""Two real Envoys 1.40 on one translation, one with Envoy's own filters and one with
sluicegate's native library (built here with gcc), behind one routing stage (a real
ext_proc server) and one provider, their request records collected: the native filters'
comparisons (test_native_usage_reader.py, test_native_model_reader.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from aiohttp import web

from sluicegate.filters import ExtProcServer
from sluicegate.model import Gateway
from sluicegate.native import MODULE, build
from sluicegate.xds.translate import translate
from tests.ports import free_port
from tests.translate.envoy_harness import running_envoy, static_bootstrap

from .access_log_collector import Collector, serve_collector, with_access_log

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Arms:
    urls: dict[str, str]  # arm -> its Envoy's address
    collector: Collector


@asynccontextmanager
async def native_arms(
    tmp: Path,
    arms: tuple[str, str],
    provider: Handler,
    models_for: Callable[[str, int, int], Gateway],
) -> AsyncIterator[Arms]:
    """`arms` (Envoy's filters, then the native library's) each an Envoy of the model
    `models_for(arm, its port, the provider's port)` gives, the second with the library;
    `provider` answers every request. The routing stage serves the first arm's model
    (their routes are the same)."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", provider)
    runner = web.AppRunner(app)
    await runner.setup()
    provider_port, ext_proc_port, collector_port = (free_port() for _ in range(3))
    ports = {arm: free_port() for arm in arms}
    await web.TCPSite(runner, "127.0.0.1", provider_port).start()
    collector = Collector()
    collector_server = await serve_collector(collector, collector_port)
    models = {arm: models_for(arm, port, provider_port) for arm, port in ports.items()}
    envoys, native = arms
    library = str(build(MODULE, into=tmp / "build"))
    models[native] = replace(models[native], native_module=library)
    ext_proc = ExtProcServer()
    ext_proc.load(models[envoys])
    try:
        async with AsyncExitStack() as stack:
            await ext_proc.start(f"127.0.0.1:{ext_proc_port}")
            stack.push_async_callback(ext_proc.stop, 0)
            for arm, model in models.items():
                bootstrap = static_bootstrap(translate(model), ext_proc_port=ext_proc_port)
                folder = tmp / arm
                folder.mkdir()
                await stack.enter_async_context(
                    running_envoy(with_access_log(bootstrap, collector_port), folder)
                )
            yield Arms({arm: f"http://127.0.0.1:{port}" for arm, port in ports.items()}, collector)
    finally:
        await collector_server.stop(0)
        await runner.cleanup()
