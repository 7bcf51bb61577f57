"""Stopping what a `sluicegate up` recorded in its work directory's `stack.json`.

Cleaning up by parentage misses a stack's children once their `up` was killed (their
parent is init then) and a second `up` adopted them: a test or benchmark that failed
midway would leave them running. `stack.json` names each child with its start time,
so only the very processes recorded are signalled, never a reused pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from sluicegate.stack.adoption import recorded_children, still_running


def stop_recorded_stack(work_dir: Path, grace_s: float = 5.0) -> list[int]:
    """SIGTERM every child recorded in `work_dir/stack.json` that still runs, wait up
    to grace_s, then SIGKILL the rest. Returns the pids that were still running (empty
    when their `up` had stopped them all)."""
    running = [r for r in recorded_children(work_dir).values() if still_running(r)]
    for child in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(still_running(r) for r in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for child in running:
        if still_running(child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
    return [child.pid for child in running]
