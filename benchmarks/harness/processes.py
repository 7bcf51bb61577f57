"""Waiting for a port to listen, pinning a process to a core, reading its CPU time and
stopping a process with its children."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Final

from sluicegate.testing import alive, children_of


def wait_listening(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


# Envoy on one core, the load (wrk, the upstream, the ext_proc server) on the other: at
# concurrency 1 a p50 otherwise flips between two modes (about 0.4 and 1.1 ms) with where
# the scheduler puts the processes.
ENVOY_CORE: Final = 0
LOAD_CORE: Final = "1"


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, core: int) -> None:
    """Pin every thread `pid` has now to `core`: `sched_setaffinity` on a PID sets its
    main thread only, and Envoy's workers are threads started before it is ready."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), {core})


def stop_tree(process: subprocess.Popen[bytes], grace_s: float = 20.0) -> list[int]:
    """SIGTERM `process` (it stops its own children), wait, then SIGKILL whatever
    is left of it and of its direct children. Returns the PIDs that had to be
    killed (empty when the stop was clean)."""
    children = children_of(process.pid) if process.poll() is None else []
    killed: list[int] = []
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            killed.append(process.pid)
    deadline = time.monotonic() + 5.0
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in children:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed
