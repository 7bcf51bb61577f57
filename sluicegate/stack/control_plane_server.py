"""`sluicegate control-plane FILE`: the control plane as a process of its own.

It serves ADS to every Envoy (the config's `sluicegate.xds`, or `--xds`) and its
endpoint (`/status`, `/metrics`, `/healthz`, `/drain/<provider>`; the config's
`sluicegate.http`, or `--http`, which may be `unix:/path`), and follows edits of the
file and its key files. It carries no traffic: when it dies, Envoy keeps serving its
last good config and reconnects when it is back; a restarted control plane builds the
same snapshot with the same versions (live drains from `--drained-file`), so Envoy is
sent nothing again (docs/xds-rules.md rule 3). `up` runs it as a child and restarts it;
in Kubernetes it is the control plane's Deployment.

Its gRPC server also serves OpenTelemetry's LogsService: Envoy's latency record log sends
the records of `routing: latency` routes there, and once a second the learned weights
move and, when they changed, go out over EDS (docs/latency-routing.md); Envoy's lane
record log sends the records of `auto` tenants' requests, and every tick the lane
steering moves a tenant whose usage crossed a threshold (docs/fast-lane.md, "The auto
lane").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from sluicegate.records import logs_handler
from sluicegate.stack.control_plane import ControlPlane
from sluicegate.stack.heap import settle_heap
from sluicegate.stack.status_http import start_status_http
from sluicegate.stack.watcher import watch_files
from sluicegate.xds.server import SnapshotCache, serve_ads

log = logging.getLogger("sluicegate.control_plane")


async def run_control_plane(
    path: Path,
    *,
    xds_address: str | None = None,
    http_address: str | None = None,
    drained_file: Path | None = None,
    stop_event: asyncio.Event | None = None,
) -> int:
    """Serve until stopped (SIGINT/SIGTERM); 2 if the file is invalid at start."""
    control_plane = ControlPlane(path.resolve(), SnapshotCache(), drained_file=drained_file)
    if not control_plane.load().ok or control_plane.config is None:
        return 2  # the reasons are logged; a restart by `up` tries the file again
    addresses = control_plane.config.sluicegate
    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop_event.set)
    xds = xds_address or addresses.xds
    http = http_address or addresses.http
    ads = await serve_ads(control_plane.cache, xds, handlers=[logs_handler(control_plane)])
    runner = await start_status_http(control_plane, http)
    # The config file and the key files it names: a rotated key reloads too.
    watcher = asyncio.create_task(watch_files(control_plane.watched_paths, control_plane.load))
    weigher = asyncio.create_task(
        _every(control_plane.latency.weighing.tick_s, control_plane.tick_weights, "latency weights")
    )
    steering = asyncio.create_task(
        _every(control_plane.lanes.settings.tick_s, control_plane.tick_lanes, "auto lanes")
    )
    log.info("control plane: xDS on %s, status on %s", xds, http)
    settle_heap()
    try:
        await stop_event.wait()
    finally:
        weigher.cancel()
        steering.cancel()
        watcher.cancel()
        await runner.cleanup()
        await ads.stop(1.0)
    return 0


async def _every(period_s: float, tick: Callable[[], object], what: str) -> None:
    """Call `tick` every `period_s` (the learned weights' or the auto lanes' step, each
    pushing what it changed). A bug in one tick must stop neither the ticks nor the
    control plane."""
    while True:
        await asyncio.sleep(period_s)
        try:
            tick()
        except Exception:
            log.exception("%s: a tick failed", what)
