"""`sluicegate ext-proc FILE`: one more ext_proc server, for Envoy to spread requests over.

A replica reads the same YAML as the control plane (routes for model routing, tenants and
limits for admission) and follows its edits. Replicas share rate limits only through a
Redis store (`admission.store.kind: redis`); priority gates are per replica. `sluicegate
up` starts one per `sluicegate.ext_proc_replicas` address (and restarts one that dies);
elsewhere (Kubernetes) run it as its own deployment beside Envoy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web
from prometheus_client import generate_latest

from sluicegate.config import ConfigError, load_config
from sluicegate.filters import ExtProcServer
from sluicegate.model import build_model
from sluicegate.stack.heap import settle_heap
from sluicegate.stack.http_site import serve_app
from sluicegate.stack.rejection import log_rejection
from sluicegate.stack.supervisor import Child, ChildSpec, start_children, stop_children
from sluicegate.stack.watcher import watch_file

log = logging.getLogger("sluicegate.ext_proc")


def load_into(server: ExtProcServer, path: Path) -> bool:
    """Load the file into the server; a bad file is logged and the last good one stays."""
    try:
        config = load_config(path)
    except ConfigError as err:
        log_rejection(log, err.errors, err.warnings)
        return False
    # Provider keys only shape Envoy's secrets, never the filter: none are read here.
    server.load(build_model(config, {}))
    return True


async def _serve_http(server: ExtProcServer, address: str) -> web.AppRunner:
    """This server's admission metrics on /metrics (Prometheus) and its gates, queues
    and limiter store on /status (JSON), at `host:port` or `unix:/path`."""
    registry = server.admission.metrics.registry

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def status(_: web.Request) -> web.Response:
        return web.json_response({"admission": server.admission.status()})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status)
    return await serve_app(app, address)


async def run_ext_proc(
    path: Path,
    address: str,
    stop_event: asyncio.Event | None = None,
    http_address: str | None = None,
) -> int:
    """Serve ext_proc on `address` until stopped (SIGINT/SIGTERM); returns an exit code."""
    path = path.resolve()
    server = ExtProcServer()
    if not load_into(server, path):
        return 2
    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop_event.set)
    bound = await server.start(address)
    log.info("ext_proc replica serving on %s", bound)
    runner = None if http_address is None else await _serve_http(server, http_address)
    watcher = asyncio.create_task(watch_file(path, lambda: load_into(server, path)))
    settle_heap()
    try:
        await stop_event.wait()
    finally:
        watcher.cancel()
        if runner is not None:
            await runner.cleanup()
        await server.stop()
    return 0


def replica_specs(path: Path, addresses: Sequence[str], work_dir: Path) -> list[ChildSpec]:
    """How to start `sluicegate ext-proc` for each address (log ext-proc-<index>.log)."""
    return [
        ChildSpec(
            kind="ext_proc_replica",
            name=address,
            address=address,
            argv=[sys.executable, "-m", "sluicegate", "ext-proc", str(path), "--address", address],
            log_path=work_dir / f"ext-proc-{index}.log",
        )
        for index, address in enumerate(addresses)
    ]


def start_replicas(path: Path, addresses: Sequence[str], work_dir: Path) -> list[Child]:
    """Start `sluicegate ext-proc` for each address and wait until each listens."""
    replicas = start_children(replica_specs(path, addresses, work_dir))
    for replica in replicas:
        log.info("ext_proc replica on %s", replica.spec.address)
    return replicas


def stop_replicas(replicas: Sequence[Child]) -> None:
    stop_children(replicas)
