"""Adoption (stack/adoption.py): a new `up` takes over the children a killed `up` left
running, only if each is still the very process recorded and runs the command the new
`up` would start, with the same values of the environment variables that carry its
keys; the supervisor restarts an adopted child that dies. One `up` at a time holds a
work directory."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from sluicegate.stack.adoption import (
    AdoptedProcess,
    Recorded,
    adopt,
    record,
    recorded_children,
)
from sluicegate.stack.children import accepts
from sluicegate.stack.supervisor import (
    Child,
    ChildSpec,
    Supervisor,
    start_children,
    stop_children,
)
from sluicegate.stack.work_dir import WorkDirBusy, hold_lock
from sluicegate.testing import alive
from sluicegate.testing.recorded_stack import stop_recorded_stack
from tests.ports import free_port
from tests.stack.test_supervisor import LISTENER, wait_for


def listener_argv(port: int) -> list[str]:
    return [sys.executable, "-c", LISTENER, str(port)]


def start_orphan(
    env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], list[str]]:
    """A listening process, as a killed `up` would have left it (waits until it listens)."""
    argv = listener_argv(free_port())
    process = subprocess.Popen(argv, start_new_session=True,
                               env=None if env is None else {**os.environ, **env})  # fmt: skip
    while not accepts(f"127.0.0.1:{argv[-1]}"):
        assert process.poll() is None, "the listener exited"
        time.sleep(0.02)
    return process, argv


@pytest.fixture
def orphan() -> Iterator[tuple[subprocess.Popen[bytes], list[str]]]:
    process, argv = start_orphan()
    yield process, argv
    if process.poll() is None:
        process.kill()
    process.wait()


def recorded_as_alpha(
    tmp_path: Path, process: subprocess.Popen[bytes], argv: list[str]
) -> Recorded:
    """Record `process` as the mock provider alpha in tmp_path's stack.json; read it back."""
    found = Recorded.of("mock_provider", "alpha", process.pid, argv)
    assert found is not None
    record(tmp_path, [found])
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


def test_one_up_at_a_time_holds_the_work_dir(tmp_path: Path) -> None:
    """flock: a second `up` (here a second open of the lock file) is refused with the
    holder's pid, and the work directory is free again once the holder lets go."""
    held = hold_lock(tmp_path)
    try:
        with pytest.raises(WorkDirBusy, match=f"pid {os.getpid()}"):
            hold_lock(tmp_path)
    finally:
        os.close(held)
    os.close(hold_lock(tmp_path))


def test_a_killed_holder_frees_the_work_dir(tmp_path: Path) -> None:
    code = (
        "import sys, time\nfrom pathlib import Path\n"
        "from sluicegate.stack.work_dir import hold_lock\n"
        "hold_lock(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(WorkDirBusy, match=f"pid {holder.pid}"):
            hold_lock(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    os.close(hold_lock(tmp_path))


KEY_ENV = "SLUICEGATE_MOCK_API_KEY"


def keyed_spec(argv: list[str], tmp_path: Path, key: str) -> ChildSpec:
    return ChildSpec(kind="mock_provider", name="alpha", address=f"127.0.0.1:{argv[-1]}",
                     argv=argv, log_path=tmp_path / "child.log", env={KEY_ENV: key},
                     matched_env=(KEY_ENV,))  # fmt: skip


def test_a_child_started_with_another_key_is_stopped_and_started_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A key rotated by restarting `up` with a new value reaches the child: same argv,
    another value in its environment, so the old process is replaced. Neither value is
    logged."""
    caplog.set_level(logging.INFO, logger="sluicegate.up")
    process, argv = start_orphan({KEY_ENV: "sk-old-value"})
    try:
        recorded_as_alpha(tmp_path, process, argv)
        (child,) = start_children([keyed_spec(argv, tmp_path, "sk-new-value")],
                                  recorded_children(tmp_path))  # fmt: skip
        try:
            assert process.wait(10) == -signal.SIGTERM
            assert child.process is not None and child.process.pid != process.pid
            environ = Path(f"/proc/{child.process.pid}/environ").read_bytes()
            assert b"SLUICEGATE_MOCK_API_KEY=sk-new-value\0" in environ
            assert f"{KEY_ENV}; stopping it" in caplog.text
            assert "sk-old-value" not in caplog.text and "sk-new-value" not in caplog.text
        finally:
            stop_children([child])
    finally:
        process.kill()
        process.wait()


def test_a_child_started_with_the_same_key_is_adopted(tmp_path: Path) -> None:
    process, argv = start_orphan({KEY_ENV: "sk-same-value"})
    try:
        recorded_as_alpha(tmp_path, process, argv)
        (child,) = start_children([keyed_spec(argv, tmp_path, "sk-same-value")],
                                  recorded_children(tmp_path))  # fmt: skip
        assert child.process is not None and child.process.pid == process.pid
        stop_children([child])
    finally:
        process.kill()
        process.wait()


def test_a_key_inherited_from_up_must_match_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control plane reads `api_key: {env: NAME}` from the environment it inherits
    from `up`: NAME is matched against `up`'s own environment."""
    process, argv = start_orphan({"PROVIDER_KEY_FOR_TEST": "sk-old-value"})
    try:
        monkeypatch.setenv("PROVIDER_KEY_FOR_TEST", "sk-new-value")
        spec = ChildSpec(kind="control_plane", name="xds", address=f"127.0.0.1:{argv[-1]}",
                         argv=argv, log_path=None,
                         matched_env=("PROVIDER_KEY_FOR_TEST",))  # fmt: skip
        found = Recorded.of("control_plane", "xds", process.pid, argv)
        assert found is not None
        assert adopt(found, argv, spec.expected_env()) is None
        assert process.wait(10) == -signal.SIGTERM
    finally:
        process.kill()
        process.wait()


def test_a_port_another_process_listens_on_is_refused_naming_it(
    tmp_path: Path, orphan: tuple[subprocess.Popen[bytes], list[str]]
) -> None:
    """Not recorded (say `up` was killed before it could record it): starting another
    child there would die with "address in use" while the orphan's port answered for
    it; `up` refuses instead, and the orphan is left alone."""
    process, argv = orphan
    spec = ChildSpec(kind="mock_provider", name="alpha", address=f"127.0.0.1:{argv[-1]}",
                     argv=argv, log_path=tmp_path / "child.log")  # fmt: skip
    with pytest.raises(RuntimeError, match=rf"in use by another process \(pid {process.pid}\)"):
        start_children([spec], {})
    assert process.poll() is None


def test_each_child_is_reported_as_soon_as_it_is_started(tmp_path: Path) -> None:
    """`up` records each child right after starting it, before waiting for any to
    listen: one that fails to start must not leave the others unrecorded."""
    good = listener_argv(free_port())
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    specs = [
        ChildSpec(kind="mock_provider", name="failing", address=f"127.0.0.1:{free_port()}",
                  argv=failing, log_path=tmp_path / "failing.log"),
        ChildSpec(kind="mock_provider", name="good", address=f"127.0.0.1:{good[-1]}",
                  argv=good, log_path=tmp_path / "good.log"),
    ]  # fmt: skip
    reported: list[tuple[str, int]] = []

    def on_started(child: Child) -> None:
        assert child.process is not None
        reported.append((child.name, child.process.pid))

    with pytest.raises(RuntimeError, match="failing exited with status 3"):
        start_children(specs, {}, on_started=on_started)
    assert [name for name, _ in reported] == ["failing", "good"]


def test_the_children_a_stack_json_names_are_stopped_by_the_test_helper(
    tmp_path: Path, orphan: tuple[subprocess.Popen[bytes], list[str]]
) -> None:
    process, argv = orphan
    recorded_as_alpha(tmp_path, process, argv)
    assert stop_recorded_stack(tmp_path) == [process.pid]
    assert process.wait(10) == -signal.SIGTERM
    assert stop_recorded_stack(tmp_path) == []


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
        assert child.last_exit is None and supervisor.status()[0]["last_exit"] is None
    finally:
        task.cancel()
        stop_children([child])
