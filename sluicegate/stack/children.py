"""Child processes that outlive their parent.

`sluicegate up` starts every process of the stack as a child in a session of its own
and without a parent-death signal: a signal to `up`'s terminal reaches only `up`,
which stops them in order, and a `kill -9` of `up` stops no traffic (the next `up`
adopts them: stack/adoption.py). Their logs are created 0600: Envoy's debug log
prints keys.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from sluicegate.config import parse_admin_address


class ProcessHandle(Protocol):
    """What the supervisor needs of a process: a `subprocess.Popen`, or an adopted one."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def spawn(
    argv: Sequence[str], log_path: Path | None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start argv in its own session, with stdout/stderr to log_path (None: to ours)."""
    log = None
    if log_path is not None:
        # Closed below, once the child holds its own descriptor.
        descriptor = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        log = open(descriptor, "ab")  # noqa: SIM115
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=None if log is None else subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
        )
    finally:
        if log is not None:
            log.close()  # the child holds its own descriptor


def stop(process: ProcessHandle, grace_s: float = 5.0) -> None:
    """SIGTERM, wait up to grace_s, then SIGKILL; always reaps the child."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def accepts(address: str, timeout_s: float = 0.2) -> bool:
    """Whether `host:port` or `unix:/path` accepts a connection now."""
    parsed = parse_admin_address(address)
    try:
        if parsed.path is not None:
            with socket.socket(socket.AF_UNIX) as unix:
                unix.settimeout(timeout_s)
                unix.connect(parsed.path)
        else:
            with socket.create_connection((parsed.host, parsed.port), timeout=timeout_s):
                pass
    except OSError:
        return False
    return True


def wait_listening(
    process: ProcessHandle,
    address: str,
    log_path: Path | None,
    what: str,
    timeout_s: float = 15.0,
) -> None:
    """Return once `address` accepts connections; raise with the child's log tail (or,
    when it logs to our output, a pointer there) if it exits first or never listens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            tail = (
                "(its log is above)"
                if log_path is None
                else log_path.read_text(errors="replace")[-2000:]
            )
            raise RuntimeError(f"{what} exited with status {code}:\n{tail}")
        if accepts(address):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {address}")
