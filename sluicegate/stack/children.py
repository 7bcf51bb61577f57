"""Child processes that die with their parent.

`sluicegate up` starts mock providers (and Envoy, through sluicegate.envoy) as
children. Each child asks the kernel for SIGTERM when its parent dies
(via sluicegate.process), so even a SIGKILLed `up` leaves nothing running.
"""

from __future__ import annotations

import os
import subprocess
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
