"""The process trees of the peers: their pids, their resident memory, waiting until they
are ready and idle, and stopping all of a tree (children that re-parent on their
parent's exit included)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from benchmarks.harness.rss import vm_rss_bytes
from sluicegate.process import die_with_parent
from sluicegate.testing import alive, children_of, cpu_seconds

READY_TIMEOUT_S = 120.0


def spawn(
    argv: list[str], log_path: Path, *, cwd: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """A peer's server in its own session (so stop_session ends its whole tree), dying
    with this process, its output to `log_path`."""
    with log_path.open("wb") as log:  # the child keeps its own copy
        return subprocess.Popen(
            die_with_parent(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )


def start_server(
    argv: list[str],
    log_path: Path,
    ready_url: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    headers: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """spawn a server, then wait until GET `ready_url` answers 200 and its tree is idle;
    stops the whole session if it never gets there."""
    process = spawn(argv, log_path, cwd=cwd, env=env)
    try:
        wait_http(ready_url, process, lambda: log_path.read_text(errors="replace")[-3000:],
                  headers)  # fmt: skip
        wait_idle(lambda: tree(process.pid))
    except BaseException:
        stop_session(process)
        raise
    return process


def tree(pid: int) -> list[int]:
    """`pid` and every process under it, now (those already gone are left out)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        if alive(current):
            found.append(current)
            todo.extend(children_of(current))
    return found


def rss_bytes(pids: list[int]) -> int:
    """Sum of VmRSS over `pids` (a process gone meanwhile counts nothing)."""
    return sum(vm_rss_bytes(pid) or 0 for pid in pids)


def tree_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def wait_http(
    url: str,
    process: subprocess.Popen[bytes],
    log: Callable[[], str],
    headers: Mapping[str, str] | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> None:
    """Until GET `url` answers 200; RuntimeError with the log's tail if `process` exits
    or the time runs out."""
    deadline = time.monotonic() + timeout_s
    last = "not asked"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode} while starting:\n{log()}")
        request = urllib.request.Request(url, headers=dict(headers or {}))
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}"
        except OSError as err:
            last = str(err)
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s ({last}):\n{log()}")


def wait_idle(
    pids: Callable[[], list[int]],
    timeout_s: float = 60.0,
    window_s: float = 1.0,
    busy_share: float = 0.05,
) -> None:
    """Until the tree spends under `busy_share` of a core over `window_s`: a ready probe
    answers as soon as one worker serves, while the others (LiteLLM's extra workers)
    may still be importing; measuring then would count their start-up. (An idle
    sluicegate stack spent 2-3 % of a core here: its control plane polls its file every
    20 ms.) Gives up
    quietly after `timeout_s` (a peer busy at idle is a finding, not a failure)."""
    deadline = time.monotonic() + timeout_s
    before = tree_cpu_s(pids())
    while time.monotonic() < deadline:
        time.sleep(window_s)
        now = tree_cpu_s(pids())
        if now - before < busy_share * window_s:
            return
        before = now


def stop_session(process: subprocess.Popen[bytes], grace_s: float = 15.0) -> list[int]:
    """SIGTERM the session `process` leads (started with start_new_session) and every
    process of its tree, wait up to `grace_s`, then SIGKILL what is left. The tree is
    listed before the signal: children re-parent once their parent is gone. Returns
    the pids that had to be killed."""
    members = tree(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(max(0.0, deadline - time.monotonic()))
    while any(alive(pid) for pid in members) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = []
    for pid in [*members, *tree(process.pid)]:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    if process.poll() is None:
        process.kill()
    process.wait()
    return killed
