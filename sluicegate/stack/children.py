"""Child processes that die with their parent.

`sluicegate up` starts mock providers (and Envoy, through sluicegate.envoy) as
children. Each child asks the kernel for SIGTERM when its parent dies
(via sluicegate.process), so even a SIGKILLed `up` leaves nothing running.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from sluicegate.process import die_with_parent


def spawn(
    argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start argv with stdout/stderr to log_path; it gets SIGTERM if we die."""
    log = log_path.open("ab")
    try:
        return subprocess.Popen(
            die_with_parent(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )
    finally:
        log.close()  # the child holds its own descriptor


def stop(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM, wait up to grace_s, then SIGKILL; always reaps the child."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_listening(
    process: subprocess.Popen[bytes],
    host: str,
    port: int,
    log_path: Path,
    what: str,
    timeout_s: float = 15.0,
) -> None:
    """Return once host:port accepts connections; raise with the child's log tail if it
    exits first or never listens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{what} exited:\n{tail}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {host}:{port}")
