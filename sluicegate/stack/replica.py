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
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web
from prometheus_client import generate_latest

from sluicegate.config import ConfigError, load_config_text
from sluicegate.filters import ExtProcServer
from sluicegate.model import build_model
from sluicegate.stack.heap import settle_heap
from sluicegate.stack.http_site import serve_app
from sluicegate.stack.rejection import log_rejection
from sluicegate.stack.supervisor import ChildSpec
from sluicegate.stack.watcher import watch_file

log = logging.getLogger("sluicegate.ext_proc")


def load_into(server: ExtProcServer, path: Path, last_good: Path | None = None) -> bool:
    """Load the file into the server; a bad file is logged and the last good one stays.
    With `last_good`, a file that loaded is also copied there (see `run_ext_proc`)."""
    try:
        text = path.read_text(encoding="utf-8")
        config = load_config_text(text, str(path))
    except OSError as err:
        log.error("cannot read %s: %s", path, err)
        return False
    except ConfigError as err:
        log_rejection(log, err.errors, err.warnings)
        return False
    # Provider keys only shape Envoy's secrets, never the filter: none are read here.
    server.load(build_model(config, {}))
    if last_good is not None:
        _keep(last_good, text)
    return True


def load_last_good(server: ExtProcServer, path: Path, last_good: Path) -> bool:
    """Serve the copy a previous run kept of the file's last good version, read as if it
    were the file (its relative paths resolve alike), when the file itself is invalid."""
    try:
        config = load_config_text(last_good.read_text(encoding="utf-8"), str(path))
    except (OSError, ConfigError):
        return False
    server.load(build_model(config, {}))
    log.error("%s is invalid; serving its last good version (kept in %s) until it is fixed",
              path, last_good)  # fmt: skip
    return True


def _keep(last_good: Path, text: str) -> None:
    """Replace the copy whole (write, then rename), owner-only like the work directory."""
    try:
        partial = last_good.with_name(f"{last_good.name}.{os.getpid()}.partial")
        partial.write_text(text, encoding="utf-8")
        partial.chmod(0o600)
        os.replace(partial, last_good)
    except OSError as err:
        log.warning("cannot keep the last good config in %s: %s", last_good, err)


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
    last_good: Path | None = None,
    control_plane: str | None = None,
) -> int:
    """Serve ext_proc on `address` until stopped (SIGINT/SIGTERM); returns an exit code.

    `last_good`: where to keep a copy of the file's last good version. A server that
    starts (say restarted by `up` after a crash) while the file is invalid then serves
    that copy instead of exiting, so the data path does not wait for the file's fix;
    it keeps watching the file and takes it once it is valid again. `control_plane`: where
    the auto lane's usage notes go, if not the config's `sluicegate.xds`."""
    path = path.resolve()
    server = ExtProcServer(control_plane=control_plane)
    if not load_into(server, path, last_good) and (
        last_good is None or not load_last_good(server, path, last_good)
    ):
        return 2
    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop_event.set)
    bound = await server.start(address)
    log.info("ext_proc server serving on %s", bound)
    runner = None if http_address is None else await _serve_http(server, http_address)
    watcher = asyncio.create_task(watch_file(path, lambda: load_into(server, path, last_good)))
    settle_heap()
    try:
        await stop_event.wait()
    finally:
        watcher.cancel()
        if runner is not None:
            await runner.cleanup()
        await server.stop()
    return 0


LAST_GOOD_NAME = "last-good.yaml"


def replica_http(sockets: Path, index: int) -> str:
    """The private endpoint of replica `index` (`up` sums its /metrics with the others')."""
    return f"unix:{sockets / f'ext-proc-{index}.sock'}"


def replica_specs(
    path: Path, addresses: Sequence[str], work_dir: Path, sockets: Path
) -> list[ChildSpec]:
    """How to start `sluicegate ext-proc` for each address (log ext-proc-<index>.log,
    endpoint replica_http), keeping the file's last good version in the work directory."""
    last_good = str(work_dir / LAST_GOOD_NAME)
    command = [sys.executable, "-m", "sluicegate", "ext-proc", str(path)]
    return [
        ChildSpec(
            kind="ext_proc_replica",
            name=address,
            address=address,
            argv=[
                *command,
                *("--address", address, "--http", replica_http(sockets, index)),
                *("--last-good", last_good),
            ],
            log_path=work_dir / f"ext-proc-{index}.log",
        )
        for index, address in enumerate(addresses)
    ]
