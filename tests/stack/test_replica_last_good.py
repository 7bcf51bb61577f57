"""An ext_proc server keeps its file's last good version and serves it when the file is
invalid at start (after a crash, `up` restarts it): the data path does not wait for the
file's fix (stack/replica.py). And an access log that cannot be opened never crashes it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from sluicegate.config import load_config_text
from sluicegate.filters import ExtProcServer
from sluicegate.model import build_model
from sluicegate.stack.replica import load_into, run_ext_proc
from tests.ports import free_port

CONFIG = """
version: 1
listeners: [{name: main, port: 8080}]
providers:
  - {name: alpha, base_url: "http://127.0.0.1:18081/v1"}
routes:
  - {name: r, models: [MODEL], backends: [{provider: alpha}]}
"""


def test_a_file_that_loads_is_kept(tmp_path: Path) -> None:
    path, last_good = tmp_path / "sluicegate.yaml", tmp_path / "last-good.yaml"
    path.write_text(CONFIG.replace("MODEL", "m1"))
    assert load_into(ExtProcServer(), path, last_good)
    assert last_good.read_text() == path.read_text()
    assert last_good.stat().st_mode & 0o777 == 0o600
    path.write_text("not: [valid")
    assert not load_into(ExtProcServer(), path, last_good)
    assert "m1" in last_good.read_text()  # a rejected file never replaces the copy


async def test_an_invalid_file_at_start_serves_the_last_good_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, last_good = tmp_path / "sluicegate.yaml", tmp_path / "last-good.yaml"
    path.write_text(CONFIG.replace("MODEL", "m1"))
    assert load_into(ExtProcServer(), path, last_good)
    path.write_text(CONFIG.replace("MODEL", "m1") + "\nnot_a_section: true\n")
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_ext_proc(path, f"127.0.0.1:{free_port()}", stop, None, last_good)
    )
    await asyncio.sleep(1.0)
    assert not task.done(), "it exited instead of serving the last good copy"
    assert "serving its last good version" in caplog.text
    stop.set()
    assert await asyncio.wait_for(task, 10) == 0
    # Without a copy, an invalid file at start is still an error (exit 2).
    assert await run_ext_proc(path, f"127.0.0.1:{free_port()}", asyncio.Event()) == 2


def test_an_access_log_that_cannot_be_opened_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    text = CONFIG.replace("MODEL", "m1") + f"access_log: {{path: {tmp_path}/missing/a.jsonl}}\n"
    gateway = build_model(load_config_text(text, str(tmp_path / "sluicegate.yaml")), {})
    ExtProcServer().load(gateway)
    assert "cannot be opened" in caplog.text
