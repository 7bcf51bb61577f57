"""Key rotation without Envoy: the control plane re-reads keys on each load, a changed key
changes only its SDS secret, and editing a key file alone triggers the reload."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sluicegate.stack.control_plane import ControlPlane
from sluicegate.stack.watcher import watch_files
from sluicegate.xds.server import SECRET, SnapshotCache

CONFIG = """
version: 1
listeners: [{name: main, port: 8080}]
providers:
  - {name: alpha, base_url: "http://127.0.0.1:18081/v1", api_key: {file: keys/alpha.key}}
  - {name: beta, base_url: "http://127.0.0.1:18082/v1", api_key: {file: /ABS/beta.key}}
  - {name: plain, base_url: "http://127.0.0.1:18083/v1"}
routes:
  - {name: r, models: [m], backends: [{provider: alpha}, {provider: beta}, {provider: plain}]}
"""


def setup(tmp_path: Path) -> ControlPlane:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "alpha.key").write_text("sk-alpha-1\n")
    (tmp_path / "abs").mkdir()
    (tmp_path / "abs" / "beta.key").write_text("sk-beta-1\n")
    path = tmp_path / "sluicegate.yaml"
    path.write_text(CONFIG.replace("/ABS", str(tmp_path / "abs")))
    plane = ControlPlane(path, SnapshotCache())
    assert plane.load().ok
    return plane


def secret_value(plane: ControlPlane, name: str) -> str:
    assert plane.snapshot is not None
    value: str = plane.snapshot.get(SECRET, name).generic_secret.secret.inline_string
    return value


def test_watched_paths_are_the_config_and_its_key_files(tmp_path: Path) -> None:
    plane = setup(tmp_path)
    assert plane.watched_paths() == [
        plane.path,
        plane.path.parent / "keys" / "alpha.key",
        tmp_path / "abs" / "beta.key",
    ]


def test_reload_reads_the_key_file_again_and_changes_only_the_secret(tmp_path: Path) -> None:
    plane = setup(tmp_path)
    assert secret_value(plane, "sluicegate-key-alpha") == "Bearer sk-alpha-1"
    (tmp_path / "keys" / "alpha.key").write_text("sk-alpha-2\n")
    outcome = plane.load()
    assert outcome.ok and outcome.changed_types == [SECRET]
    assert secret_value(plane, "sluicegate-key-alpha") == "Bearer sk-alpha-2"
    assert secret_value(plane, "sluicegate-key-beta") == "Bearer sk-beta-1"


def test_an_emptied_key_file_keeps_the_last_good_key(tmp_path: Path) -> None:
    plane = setup(tmp_path)
    (tmp_path / "keys" / "alpha.key").write_text("")
    outcome = plane.load()
    assert not outcome.ok
    assert any("alpha.key" in problem and "empty" in problem for problem in outcome.problems)
    assert not any("sk-" in problem for problem in outcome.problems)
    assert secret_value(plane, "sluicegate-key-alpha") == "Bearer sk-alpha-1"


async def test_editing_a_key_file_alone_reloads(tmp_path: Path) -> None:
    plane = setup(tmp_path)
    reloaded = asyncio.Event()

    def on_change() -> None:
        plane.load()
        reloaded.set()

    watcher = asyncio.create_task(watch_files(plane.watched_paths, on_change, interval_s=0.02))
    try:
        await asyncio.sleep(0.1)
        assert not reloaded.is_set()
        # Like a Kubernetes Secret volume or an editor: write elsewhere, rename over it.
        replacement = tmp_path / "abs" / "beta.key.new"
        replacement.write_text("sk-beta-2\n")
        replacement.replace(tmp_path / "abs" / "beta.key")
        await asyncio.wait_for(reloaded.wait(), 5)
        assert secret_value(plane, "sluicegate-key-beta") == "Bearer sk-beta-2"
        # A key file that a later config adds is watched from then on.
        reloaded.clear()
        (tmp_path / "plain.key").write_text("sk-plain-1\n")
        text = plane.path.read_text().replace(
            '18083/v1"}', '18083/v1", api_key: {file: plain.key}}'
        )
        plane.path.write_text(text)
        await asyncio.wait_for(reloaded.wait(), 5)
        assert secret_value(plane, "sluicegate-key-plain") == "Bearer sk-plain-1"
        reloaded.clear()
        (tmp_path / "plain.key").write_text("sk-plain-2\n")
        await asyncio.wait_for(reloaded.wait(), 5)
        assert secret_value(plane, "sluicegate-key-plain") == "Bearer sk-plain-2"
    finally:
        watcher.cancel()
