"""Adoption (stack/adoption.py): a new `up` takes over the children a killed `up` left
running, only if each is still the very process recorded and runs the command the new
`up` would start; the supervisor restarts an adopted child that dies."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.stack.adoption import (
    AdoptedProcess,
    Recorded,
    adopt,
    record,
    recorded_children,
    running_up,
    start_ticks,
)
from sluicegate.stack.supervisor import ChildSpec, Supervisor, start_children, stop_children
from sluicegate.testing import alive
from tests.ports import free_port
from tests.stack.test_supervisor import LISTENER, wait_for


def listener_argv(port: int) -> list[str]:
    return [sys.executable, "-c", LISTENER, str(port)]


@pytest.fixture
def orphan() -> Iterator[tuple[subprocess.Popen[bytes], list[str]]]:
    """A listening process, as a killed `up` would have left it."""
    argv = listener_argv(free_port())
    process = subprocess.Popen(argv, start_new_session=True)
    yield process, argv
    if process.poll() is None:
        process.kill()
    process.wait()


def recorded_as_alpha(
    tmp_path: Path, process: subprocess.Popen[bytes], argv: list[str]
) -> Recorded:
    """Record `process` as the mock provider alpha in tmp_path's stack.json; read it back."""
    assert start_ticks(process.pid) is not None
    record(tmp_path, os.getpid(), [("mock_provider", "alpha", process.pid, argv)])
    return recorded_children(tmp_path)[("mock_provider", "alpha")]


def test_a_recorded_child_running_the_same_command_is_adopted(
    tmp_path: Path, orphan: tuple[subprocess.Popen[bytes], list[str]]
) -> None:
    process, argv = orphan
    adopted = adopt(recorded_as_alpha(tmp_path, process, argv), argv)
    assert adopted is not None and adopted.pid == process.pid
    assert adopted.poll() is None
    process.kill()
    process.wait()  # reaped here, as init would
    assert adopted.poll() == AdoptedProcess.UNKNOWN_EXIT


def test_a_recorded_child_running_another_command_is_stopped_not_adopted(
    tmp_path: Path, orphan: tuple[subprocess.Popen[bytes], list[str]]
) -> None:
    process, argv = orphan
    assert adopt(recorded_as_alpha(tmp_path, process, argv), [*argv, "--ttft-ms", "50"]) is None
    assert process.wait(10) == -signal.SIGTERM


def test_a_reused_pid_is_never_adopted(
    tmp_path: Path, orphan: tuple[subprocess.Popen[bytes], list[str]]
) -> None:
    """Same pid and command but another start time: another process, left alone."""
    process, argv = orphan
    recorded = recorded_as_alpha(tmp_path, process, argv)
    stale = Recorded(**{**recorded.__dict__, "ticks": recorded.ticks - 1})
    assert adopt(stale, argv) is None
    assert process.poll() is None  # not signalled


def test_another_up_still_running_on_the_work_dir_is_found(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert start_ticks(sleeper.pid) is not None
        record(tmp_path, sleeper.pid, [])
        assert running_up(tmp_path) == sleeper.pid
        sleeper.kill()
        sleeper.wait()
        assert running_up(tmp_path) is None
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_an_adopted_child_that_dies_is_restarted_as_our_own(
    tmp_path: Path,
    orphan: tuple[subprocess.Popen[bytes], list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sluicegate.up")
    process, argv = orphan
    port = int(argv[-1])
    recorded_as_alpha(tmp_path, process, argv)
    spec = ChildSpec(kind="mock_provider", name="alpha", address=f"127.0.0.1:{port}",
                     argv=argv, log_path=tmp_path / "child.log")  # fmt: skip
    (child,) = start_children([spec], recorded_children(tmp_path))
    assert child.process is not None and child.process.pid == process.pid
    assert f"mock_provider alpha (pid {process.pid}) adopted" in caplog.text
    supervisor = Supervisor([child])
    task = asyncio.create_task(supervisor.run())
    try:
        process.kill()
        process.wait()
        await wait_for(lambda: child.restarts == 1 and child.state == "up")
        assert isinstance(child.process, subprocess.Popen) and alive(child.process.pid)
        assert f"(pid {process.pid}) exited with status unknown" in caplog.text
    finally:
        task.cancel()
        stop_children([child])
