"""`sluicegate up`: the whole local stack in one command.

Starts, in make-before-use order: the mock providers the config declares, the
ADS server, the ext_proc filter, the status endpoint, and finally Envoy
(bootstrapped to take everything else from the ADS server). A mock or replica that
dies is restarted (stack/supervisor.py); `/status` lists every process and its state.
SIGINT or SIGTERM stops all of it in reverse order; children also die with this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluicegate.config import (
    ConfigError,
    load_config,
    parse_admin_address,
    resolve_api_keys,
    split_host_port,
)
from sluicegate.envoy import EnvoyProcess, make_bootstrap
from sluicegate.filters import ExtProcServer
from sluicegate.stack.control_plane import ControlPlane
from sluicegate.stack.heap import settle_heap
from sluicegate.stack.mocks import start_mocks, stop_mocks
from sluicegate.stack.replica import start_replicas, stop_replicas
from sluicegate.stack.status_http import start_status_http
from sluicegate.stack.supervisor import Supervisor
from sluicegate.stack.watcher import watch_files
from sluicegate.xds.server import SnapshotCache, serve_ads

log = logging.getLogger("sluicegate.up")


@dataclass(frozen=True)
class UpOptions:
    config_path: Path
    ads_mode: str = "sotw"  # or "delta"
    node_id: str = "sluicegate-gateway"
    envoy_concurrency: int = 2
    start_envoy: bool = True
    start_mocks: bool = True
    work_dir: Path | None = None


async def run_up(options: UpOptions, stop_event: asyncio.Event | None = None) -> int:
    """Run the stack until stop_event is set (or SIGINT/SIGTERM); returns an exit code."""
    path = options.config_path.resolve()
    try:
        config = load_config(path)
        keys = resolve_api_keys(config, path)
    except ConfigError as err:
        for problem in err.problems:
            log.error("%s", problem)
        return 2

    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop_event.set)

    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="sluicegate-up-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    addresses = config.sluicegate
    async with contextlib.AsyncExitStack() as stack:
        if options.work_dir is None:
            # A folder `up` made itself; first in, so it goes last, once every process
            # writing into it has stopped. --work-dir keeps the logs, and so does a
            # failure: its error names the logs to read (EnvoyStartError, for one).
            def remove_unless_failed(failed: type[BaseException] | None, *_: object) -> None:
                if failed is None:
                    shutil.rmtree(work_dir, ignore_errors=True)
                else:
                    log.error("logs kept in %s", work_dir)

            stack.push(remove_unless_failed)
        supervisor = Supervisor([])
        if options.start_mocks:
            mocks = await asyncio.to_thread(start_mocks, config, keys, work_dir)
            stack.callback(stop_mocks, mocks)
            supervisor.add(mocks)
            for mock in mocks:
                log.info("mock provider %s on 127.0.0.1:%d", mock.name, mock.port)

        cache = SnapshotCache()
        ext_proc = ExtProcServer()
        control_plane = ControlPlane(
            path,
            cache,
            on_model=ext_proc.load,
        )
        if not control_plane.load().ok:
            return 2

        ads = await serve_ads(cache, addresses.xds)
        stack.push_async_callback(ads.stop, 1.0)
        await ext_proc.start(addresses.ext_proc)
        stack.push_async_callback(ext_proc.stop)
        replicas = await asyncio.to_thread(
            start_replicas, path, addresses.ext_proc_replicas, work_dir
        )
        stack.callback(stop_replicas, replicas)
        supervisor.add(replicas)
        envoy: EnvoyProcess | None = None

        def processes() -> list[dict[str, Any]]:
            """Every process of the stack, for /status: this one (xDS and the main
            ext_proc), the supervised children, and Envoy."""
            here = {"pid": os.getpid(), "state": "up", "restarts": 0, "last_exit": None}
            found = [
                {"kind": "control_plane", "name": "xds", "address": addresses.xds, **here},
                {"kind": "ext_proc", "name": "main", "address": addresses.ext_proc, **here},
                *supervisor.status(),
            ]
            if envoy is not None:
                found.append(
                    {
                        "kind": "envoy",
                        "name": options.node_id,
                        "address": addresses.envoy_admin,
                        "pid": envoy.pid,
                        "state": "up" if envoy.running else "down",  # running reaps it
                        "restarts": 0,
                        "last_exit": envoy.returncode,
                    }
                )
            return found

        http_host, http_port = split_host_port(addresses.http)
        runner = await start_status_http(
            control_plane,
            http_host,
            http_port,
            registries=[ext_proc.admission.metrics.registry],
            extra_status=lambda: {
                "admission": ext_proc.admission.status(),
                "processes": processes(),
            },
        )
        stack.push_async_callback(runner.cleanup)
        log.info("xDS on %s, ext_proc on %s, status on %s",
                 addresses.xds, addresses.ext_proc, addresses.http)  # fmt: skip

        if options.start_envoy:
            admin_socket = parse_admin_address(addresses.envoy_admin).path
            if admin_socket is not None:
                # Envoy binds the socket but does not make its directory.
                Path(admin_socket).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            bootstrap = make_bootstrap(
                node_id=options.node_id,
                cluster="sluicegate",
                xds_address=addresses.xds,
                ext_proc_address=addresses.ext_proc_servers,
                admin_address=addresses.envoy_admin,
                ads_mode=options.ads_mode,
            )
            envoy = EnvoyProcess(bootstrap, work_dir=work_dir,
                                 concurrency=options.envoy_concurrency)  # fmt: skip
            await envoy.start()
            stack.push_async_callback(envoy.stop)
            stack.callback(asyncio.create_task(_watch_envoy(envoy)).cancel)
            for listener in config.listeners:
                log.info("gateway listening on http://%s:%d", listener.address, listener.port)
            log.info("Envoy admin on %s (logs in %s)", envoy.admin_url, work_dir)

        # The config file and the key files it names: a rotated key reloads too.
        watcher = asyncio.create_task(watch_files(control_plane.watched_paths, control_plane.load))
        stack.callback(watcher.cancel)
        # Cancelled first on the way out, so no child is restarted while being stopped.
        stack.callback(asyncio.create_task(supervisor.run()).cancel)
        settle_heap()
        log.info("sluicegate is up; Ctrl-C stops everything")
        await stop_event.wait()
        log.info("stopping")
    return 0


async def _watch_envoy(envoy: EnvoyProcess) -> None:
    """Reap an Envoy that exits and say so (it is not restarted: /status shows it down)."""
    while envoy.running:
        await asyncio.sleep(0.5)
    log.error("Envoy (pid %s) exited with status %s; its log: %s",
              envoy.pid, envoy.returncode, envoy.log_path)  # fmt: skip
