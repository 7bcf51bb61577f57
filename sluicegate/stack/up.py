"""`sluicegate up`: the whole local stack in one command.

`up` itself carries no traffic and serves no xDS: it starts the stack's processes,
restarts any that dies (stack/supervisor.py) and answers `/status` for all of them
(stack/up_http.py). In make-before-use order: the mock providers the config declares,
the control plane (`sluicegate control-plane`), the main ext_proc server and the
replicas (`sluicegate ext-proc`), its own endpoint, and finally Envoy (bootstrapped to
take everything else from the control plane). SIGINT or SIGTERM stops all of it in
reverse order. If `up` itself is killed, the children serve on, and the next `up` on
the same work directory adopts them (stack/adoption.py). One `up` runs on a work
directory at a time (stack/work_dir.py, `hold_lock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sluicegate.config import (
    NATIVE_NODE,
    Config,
    ConfigError,
    load_config,
    resolve_api_keys,
    resolve_client_keys,
)
from sluicegate.native import MODULE, NativeBuildError, build
from sluicegate.stack.adoption import (
    Recorded,
    record,
    recorded_children,
    still_running,
    stop_recorded,
)
from sluicegate.stack.envoy_child import envoy_spec, wait_ready
from sluicegate.stack.heap import settle_heap
from sluicegate.stack.mocks import mock_specs
from sluicegate.stack.replica import LAST_GOOD_NAME, replica_http, replica_specs
from sluicegate.stack.supervisor import (
    Child,
    ChildSpec,
    Supervisor,
    start_children,
    stop_children,
)
from sluicegate.stack.up_http import ChildEndpoint, start_up_http
from sluicegate.stack.work_dir import WorkDirBusy, default_work_dir, hold_lock, socket_dir

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
        resolve_client_keys(config, path)  # refused here, before anything starts
    except ConfigError as err:
        for problem in err.problems:
            log.error("%s", problem)
        return 2
    work_dir = (options.work_dir or default_work_dir(path)).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = hold_lock(work_dir)
    except WorkDirBusy as err:
        log.error("%s", err)
        return 2
    try:
        return await _run_locked(options, path, config, keys, work_dir, stop_event)
    finally:
        os.close(lock)


async def _run_locked(
    options: UpOptions,
    path: Path,
    config: Config,
    keys: Mapping[str, str | None],
    work_dir: Path,
    stop_event: asyncio.Event | None,
) -> int:
    """The stack's life, while this `up` holds the work directory's lock."""
    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop_event.set)

    addresses = config.sluicegate
    sockets = socket_dir(work_dir)
    control_plane_http = f"unix:{sockets / 'control-plane.sock'}"
    ext_proc_http = f"unix:{sockets / 'ext-proc.sock'}"
    # Make-before-use order; stopped in reverse.
    specs = [
        *(mock_specs(config, keys, work_dir) if options.start_mocks else []),
        _control_plane_spec(path, addresses.xds, control_plane_http, work_dir, config),
        _main_ext_proc_spec(path, addresses.ext_proc, ext_proc_http, work_dir),
        *replica_specs(path, addresses.ext_proc_replicas, work_dir, sockets),
    ]
    # gcc takes about a second the first time: not on the event loop.
    native_module = (
        await asyncio.to_thread(_native_library)
        if options.start_envoy and config.native_filters.module == NATIVE_NODE
        else None
    )
    # Envoy last, once `up`'s endpoint answers: /status works whenever the gateway does.
    envoy = [
        envoy_spec(work_dir, node_id=options.node_id, xds=addresses.xds,
                   ext_proc_servers=list(addresses.ext_proc_servers),
                   admin=addresses.envoy_admin, ads_mode=options.ads_mode,
                   concurrency=options.envoy_concurrency, native_module=native_module)
    ] if options.start_envoy else []  # fmt: skip
    recorded = recorded_children(work_dir)
    # What stack.json must keep naming until each is adopted, stopped or gone: were
    # `up` killed while it starts the stack, the next `up` still finds them.
    pending = dict(recorded)
    for key, left in recorded.items():
        if key not in {(spec.kind, spec.name) for spec in [*specs, *envoy]}:
            stop_recorded(left)  # left by an earlier `up` of another config
            del pending[key]

    async with contextlib.AsyncExitStack() as stack:
        if options.work_dir is None:
            # The default folder; first in, so it goes last, once every process writing
            # into it has stopped. --work-dir keeps the logs, and so does a failure: its
            # error names the logs to read.
            def remove_unless_failed(failed: type[BaseException] | None, *_: object) -> None:
                if failed is None:
                    shutil.rmtree(work_dir, ignore_errors=True)
                else:
                    log.error("logs kept in %s", work_dir)

            stack.push(remove_unless_failed)

        def record_stack() -> None:
            ours = [Recorded.of(c.spec.kind, c.name, c.process.pid, c.spec.argv)
                    for c in supervisor.children if c.process is not None]  # fmt: skip
            left = [r for r in pending.values() if still_running(r)]
            record(work_dir, [*left, *(r for r in ours if r is not None)])

        def record_started(child: Child) -> None:
            pending.pop((child.spec.kind, child.name), None)
            supervisor.add([child])
            record_stack()

        def start(specs: list[ChildSpec]) -> list[Child]:
            children = start_children(specs, recorded, on_started=record_started)
            stack.callback(stop_children, children)
            for child in children:
                log.info("%s %s on %s (pid %s)", child.spec.kind, child.name,
                         child.spec.address, child.process and child.process.pid)  # fmt: skip
            return children

        supervisor = Supervisor([], on_change=record_stack, stopping=stop_event)
        await asyncio.to_thread(start, specs)
        runner = await start_up_http(
            addresses.http,
            ChildEndpoint(control_plane_http),
            ChildEndpoint(ext_proc_http),
            supervisor.status,
            # Its own Envoy's admin, for each route's provider health (none with --no-envoy).
            ChildEndpoint(addresses.envoy_admin) if envoy else None,
            {
                address: ChildEndpoint(replica_http(sockets, index))
                for index, address in enumerate(addresses.ext_proc_replicas)
            },
        )
        stack.push_async_callback(runner.cleanup)
        log.info("status on http://%s/status", addresses.http)
        if envoy:
            (started,) = await asyncio.to_thread(start, envoy)
            await asyncio.to_thread(wait_ready, started)
            for listener in config.listeners:
                log.info("gateway listening on http://%s:%d", listener.address, listener.port)
            log.info("Envoy admin on %s (logs in %s)", addresses.envoy_admin, work_dir)

        # Cancelled first on the way out, so no child is restarted while being stopped.
        stack.callback(asyncio.create_task(supervisor.run()).cancel)
        settle_heap()
        log.info("sluicegate is up; Ctrl-C stops everything")
        await stop_event.wait()
        log.info("stopping")
    return 0


def _sluicegate(*args: str) -> list[str]:
    """argv for `sluicegate ARGS`, with -v when `up` itself logs at DEBUG."""
    verbose = ["-v"] if logging.getLogger().isEnabledFor(logging.DEBUG) else []
    return [sys.executable, "-m", "sluicegate", *verbose, *args]


def _native_library() -> str | None:
    """The native filters library, built for the Envoy `up` starts on this machine, which
    names it in its bootstrap (native_filters.module: node; docs/native-filters.md); None
    if gcc cannot build it. Only with `node`: `auto` and a path name theirs to every
    Envoy, and `off` none (the bootstrap is written at `up`'s start: a reload to `node`
    finds `up`'s Envoy naming none)."""
    try:
        return str(build(MODULE))
    except NativeBuildError as error:
        log.warning("native filters not built, Envoy's own filters instead: %s", error)
        return None


def _control_plane_spec(
    path: Path, xds: str, http: str, work_dir: Path, config: Config
) -> ChildSpec:
    """The control plane: ADS on `xds`, its endpoint on `http`; it logs to `up`'s output
    (reloads and their rejections are what a user of `up` watches). It reads the
    providers' and clients' keys from the environment variables the file names
    (`api_key.env`, `secret.env`),
    inherited from `up`: an adopted one must have the same values."""
    argv = _sluicegate("control-plane", str(path), "--xds", xds, "--http", http,
                       "--drained-file", str(work_dir / "drained.json"))  # fmt: skip
    sources = [p.api_key for p in config.providers]
    sources += [key.secret for tenant in config.tenants for key in tenant.keys]
    names = sorted({source.env for source in sources if source and source.env})
    return ChildSpec(kind="control_plane", name="xds", address=xds, argv=argv, log_path=None,
                     matched_env=tuple(names))  # fmt: skip


def _main_ext_proc_spec(path: Path, address: str, http: str, work_dir: Path) -> ChildSpec:
    """The main ext_proc server; like the replicas, it keeps the file's last good version
    in the work directory and serves it if restarted while the file is invalid."""
    argv = _sluicegate("ext-proc", str(path), "--address", address, "--http", http,
                       "--last-good", str(work_dir / LAST_GOOD_NAME))  # fmt: skip
    return ChildSpec(kind="ext_proc", name="main", address=address, argv=argv, log_path=None)
