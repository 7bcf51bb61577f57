"""Child processes that die with their parent.

`sluicegate up` starts mock providers (and Envoy, through sluicegate.envoy) as
children. Each child asks the kernel for SIGTERM when its parent dies
(PR_SET_PDEATHSIG), so even a SIGKILLed `up` leaves nothing running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child between fork and exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start argv with stdout/stderr to log_path; it gets SIGTERM if we die."""
    log = log_path.open("ab")
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
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
