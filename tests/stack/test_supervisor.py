"""The Supervisor that `up` runs over its children: a child that dies is reaped, logged
and started again with backoff; /status says what each is doing."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from sluicegate.stack.supervisor import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    ChildSpec,
    Supervisor,
    backoff_s,
    start_children,
    stop_children,
)
from sluicegate.testing import alive
from tests.ports import free_port

# A child that listens on the port given, then serves until killed.
LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "time.sleep(3600)\n"
)


def spec(tmp_path: Path, port: int, secret: str | None = None) -> ChildSpec:
    return ChildSpec(
        kind="mock_provider",
        name="alpha",
        address=f"127.0.0.1:{port}",
        argv=[sys.executable, "-c", LISTENER, str(port)],
        log_path=tmp_path / "child.log",
        env={"SECRET_FOR_TEST": secret} if secret else None,
    )


def test_backoff_doubles_from_a_tenth_of_a_second_up_to_ten() -> None:
    waits = [backoff_s(n) for n in range(1, 12)]
    assert waits[0] == BACKOFF_FIRST_S == 0.1
    assert waits[1:4] == [0.2, 0.4, 0.8]
    assert waits[-1] == BACKOFF_MAX_S == 10.0
    assert waits == sorted(waits)


async def wait_for(check: object, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def test_a_killed_child_is_reaped_logged_and_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluicegate.up")
    (child,) = start_children([spec(tmp_path, free_port(), secret="sk-never-shown")])
    supervisor = Supervisor([child])
    task = asyncio.create_task(supervisor.run())
    try:
        assert child.process is not None
        first = child.process.pid
        (status,) = supervisor.status()
        assert (status["state"], status["pid"], status["restarts"]) == ("up", first, 0)
        assert "sk-never-shown" not in repr(status) + repr(child.spec)
        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: child.restarts == 1 and child.state == "up")
        assert child.process.pid != first and alive(child.process.pid)
        assert child.last_exit == -signal.SIGKILL
        # Reaped: no <defunct> entry is left for the old pid.
        assert not Path(f"/proc/{first}").exists()
        logged = caplog.text
        assert f"mock_provider alpha (pid {first}) exited with status -9" in logged
        assert "mock_provider alpha restarted" in logged
    finally:
        task.cancel()
        stop_children([child])
    assert child.process is not None and child.process.poll() is not None


async def test_a_child_that_keeps_failing_is_down_with_growing_backoff(tmp_path: Path) -> None:
    port = free_port()
    (child,) = start_children([spec(tmp_path, port)])
    # From now on the child exits at once: every restart fails.
    failing = ChildSpec(
        kind=child.spec.kind, name=child.spec.name, address=child.spec.address,
        argv=[sys.executable, "-c", "raise SystemExit(3)"], log_path=child.spec.log_path,
    )  # fmt: skip
    child.spec = failing
    # It served long before this crash: the first restart starts the backoff afresh, and
    # the failed restarts after it must still make it grow.
    child._up_at = (child._up_at or 0.0) - 3_600
    supervisor = Supervisor([child])
    task = asyncio.create_task(supervisor.run())
    try:
        assert child.process is not None
        os.kill(child.process.pid, signal.SIGKILL)
        await wait_for(lambda: child.crashes_in_row >= 4)
        assert child.state != "up"
        assert child.last_exit == 3
        assert supervisor.status()[0]["state"] in ("down", "starting")
    finally:
        task.cancel()
        await asyncio.sleep(0)
        stop_children([child])


async def test_a_restart_due_while_up_stops_starts_nothing(tmp_path: Path) -> None:
    """`up` may be stopping while a restart waits out its backoff: nothing is started
    then (it would outlive `up`)."""
    (child,) = start_children([spec(tmp_path, free_port())])
    stopping = asyncio.Event()
    supervisor = Supervisor([child], stopping=stopping)
    assert child.process is not None
    old = child.process
    old.kill()
    code = old.wait()
    restart = asyncio.create_task(supervisor._restart(0, code))
    await asyncio.sleep(0)  # the restart is in its backoff now
    assert child.state == "down"
    stopping.set()
    await restart
    assert child.process is old and child.restarts == 0
    stop_children([child])


async def test_a_failing_on_change_is_logged_and_the_child_still_comes_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def on_change() -> None:
        raise OSError("disk full")

    (child,) = start_children([spec(tmp_path, free_port())])
    supervisor = Supervisor([child], on_change=on_change)
    task = asyncio.create_task(supervisor.run())
    try:
        assert child.process is not None
        os.kill(child.process.pid, signal.SIGKILL)
        await wait_for(lambda: child.restarts == 1 and child.state == "up")
        assert "disk full" in caplog.text
    finally:
        task.cancel()
        stop_children([child])


async def test_a_restart_onto_a_port_someone_else_took_is_not_taken_for_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The child's old process is gone, so a listener on its port is another process's:
    the restart names it and is retried with the backoff, never reported up."""
    caplog.set_level(logging.INFO, logger="sluicegate.up")
    port = free_port()
    (child,) = start_children([spec(tmp_path, port)])
    assert child.process is not None
    old = child.process
    old.kill()
    code = old.wait()
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        await Supervisor([child])._restart(0, code)
        assert f"in use by another process (pid {os.getpid()})" in caplog.text
        assert child.state == "down" and child.process is old and child.restarts == 0
    stop_children([child])
