"""EnvoyProcess against the real binary: start, ready, admin, stop, failures."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from sluicegate import wire
from sluicegate.envoy import EnvoyProcess, EnvoyStartError, bootstrap_yaml, make_bootstrap

from .conftest import closed_port

pytestmark = pytest.mark.timeout(60)


def unreachable_bootstrap(initial_fetch_timeout_s: float | None = 0.5) -> object:
    """ADS and ext_proc point at a closed port; admin on a port Envoy picks."""
    port = closed_port()
    return make_bootstrap(
        node_id="test",
        cluster="sluicegate",
        xds_address=f"127.0.0.1:{port}",
        ext_proc_address=f"127.0.0.1:{port}",
        admin_address="127.0.0.1:0",
        initial_fetch_timeout_s=initial_fetch_timeout_s,
    )


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_starts_live_without_a_control_plane_and_stops_cleanly():
    envoy = EnvoyProcess(unreachable_bootstrap(), concurrency=1)
    await envoy.start(timeout=20)
    try:
        assert envoy.running
        assert envoy.admin_url.startswith("http://127.0.0.1:")
        assert envoy.server_info()["state"] == "LIVE"
        stats = envoy.stats()
        assert stats["server.state"] == 0  # 0 = LIVE
        assert f"cluster.{wire.XDS_CLUSTER}.upstream_cx_total" in stats
        dump = envoy.config_dump()
        clusters = json_names(dump, "static_clusters")
        assert {wire.XDS_CLUSTER, wire.EXT_PROC_CLUSTER} <= clusters
        assert envoy.listeners() == {}
        assert envoy.log_path.parent == envoy.work_dir
    finally:
        pid = envoy.pid
        assert await envoy.stop() == 0
    assert pid is not None and not envoy.running
    assert_gone(pid)
    assert not envoy.work_dir.exists()  # made by EnvoyProcess, removed after a clean stop


def json_names(dump: dict[str, object], key: str) -> set[str]:
    names = set()
    for config in dump["configs"]:  # type: ignore[union-attr]
        for entry in config.get(key, ()):  # type: ignore[union-attr]
            names.add(entry["cluster"]["name"])
    return names


async def test_waiting_for_admin_only_returns_while_initializing(tmp_path: Path):
    envoy = EnvoyProcess(unreachable_bootstrap(None), work_dir=tmp_path, concurrency=1)
    started = time.monotonic()
    await envoy.start(timeout=20, wait_for="admin")
    try:
        assert time.monotonic() - started < 10  # LDS/CDS wait 15 s before LIVE
        assert envoy.server_info()["state"] in ("PRE_INITIALIZING", "INITIALIZING")
    finally:
        await envoy.stop()
    assert (tmp_path / "envoy.log").exists()  # a given work_dir is left in place


async def test_not_ready_in_time_raises_and_leaves_no_process(tmp_path: Path):
    envoy = EnvoyProcess(unreachable_bootstrap(None), work_dir=tmp_path, concurrency=1)
    with pytest.raises(EnvoyStartError, match="not ready after 1s"):
        await envoy.start(timeout=1.0)
    assert envoy.pid is not None and not envoy.running
    assert_gone(envoy.pid)


def test_bad_config_raises_with_envoys_log(tmp_path: Path):
    envoy = EnvoyProcess({"static_resources": {"clusters": [{"name": 1}]}}, work_dir=tmp_path)
    with pytest.raises(EnvoyStartError, match="exited with status") as failure:
        envoy.start_blocking(timeout=20)
    assert "Unable to parse JSON as proto" in str(failure.value)
    assert envoy.log_path.exists()
    envoy.stop_blocking()


def test_sync_context_manager_with_yaml_text(tmp_path: Path):
    port = closed_port()
    text = bootstrap_yaml(
        node_id="yaml",
        xds_address=f"127.0.0.1:{port}",
        ext_proc_address=f"127.0.0.1:{port}",
        admin_address="127.0.0.1:0",
        initial_fetch_timeout_s=0.5,
    )
    with EnvoyProcess(text, work_dir=tmp_path, concurrency=1) as envoy:
        assert envoy.config_path.suffix == ".yaml"
        assert envoy.server_info()["node"]["id"] == "yaml"
        pid = envoy.pid
    assert pid is not None
    assert_gone(pid)


def test_stop_before_start_is_harmless():
    envoy = EnvoyProcess({}, concurrency=1)
    assert envoy.stop_blocking() is None
    assert not envoy.work_dir.exists()


async def test_cancelled_start_leaves_no_process(tmp_path: Path):
    envoy = EnvoyProcess(unreachable_bootstrap(None), work_dir=tmp_path, concurrency=1)
    task = asyncio.create_task(envoy.start(timeout=20))
    while envoy.pid is None:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not envoy.running
    assert_gone(envoy.pid)
