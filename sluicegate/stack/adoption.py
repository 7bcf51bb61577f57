"""Taking over a stack whose `up` died: its children serve on, the next `up` adopts them.

`up` starts its children in sessions of their own and without a parent-death signal,
so a `kill -9` (or an OOM kill) of `up` stops no traffic: Envoy, the control plane,
the ext_proc servers and the mocks keep running. `up` records each child in its work
directory's `stack.json` (pid, start time, argv) whenever one starts. The next `up`
on the same work directory (the default one is the same for the same config file)
adopts every recorded child that is still the very process it recorded (same start
time) running the very command it would start now; it stops one whose command differs
(the config changed while `up` was gone) and starts the rest. An adopted child is
not `up`'s own: its exit status is not known, so it is logged as unknown.

docs/operations.md, "When a process dies".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from sluicegate.stack.children import stop

log = logging.getLogger("sluicegate.up")

STATE_FILE: Final = "stack.json"
_POLL_S: Final = 0.05


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot), or None if it is gone or a
    zombie: with the pid, it names one process (pids are reused, start times are not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def command_line(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


class AdoptedProcess:
    """A process `up` did not start but now supervises; its exit status is unknowable
    (its parent is init now), so `poll()` says only whether it still runs."""

    UNKNOWN_EXIT: Final = -1000

    def __init__(self, pid: int, ticks: int) -> None:
        self.pid = pid
        self._ticks = ticks
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and start_ticks(self.pid) != self._ticks:
            self.returncode = self.UNKNOWN_EXIT
        return self.returncode

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(_POLL_S)
        return code


@dataclass(frozen=True)
class Recorded:
    """One child as `stack.json` keeps it."""

    kind: str
    name: str
    pid: int
    ticks: int
    argv: list[str]


def record(
    work_dir: Path, up_pid: int, children: Sequence[tuple[str, str, int, list[str]]]
) -> None:
    """Write `stack.json` whole (write, then rename): `up`'s pid and each running child
    as (kind, name, pid, argv)."""
    entries = []
    for kind, name, pid, argv in children:
        ticks = start_ticks(pid)
        if ticks is not None:
            entries.append(asdict(Recorded(kind, name, pid, ticks, list(argv))))
    partial = work_dir / (STATE_FILE + ".partial")
    partial.write_text(json.dumps({"up_pid": up_pid, "up_ticks": start_ticks(up_pid),
                                   "children": entries}))  # fmt: skip
    os.replace(partial, work_dir / STATE_FILE)


def _read(work_dir: Path) -> dict[str, Any]:
    try:
        document = json.loads((work_dir / STATE_FILE).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.error("ignoring %s: %s", work_dir / STATE_FILE, err)
        return {}
    return document if isinstance(document, dict) else {}


def running_up(work_dir: Path) -> int | None:
    """The pid of another `up` still running on this work directory, if one is."""
    document = _read(work_dir)
    pid, ticks = document.get("up_pid"), document.get("up_ticks")
    if isinstance(pid, int) and pid != os.getpid() and ticks is not None:
        return pid if start_ticks(pid) == ticks else None
    return None


def recorded_children(work_dir: Path) -> dict[tuple[str, str], Recorded]:
    found: dict[tuple[str, str], Recorded] = {}
    for entry in _read(work_dir).get("children", []):
        with contextlib.suppress(TypeError):
            child = Recorded(**entry)
            found[(child.kind, child.name)] = child
    return found


def adopt(recorded: Recorded | None, argv: Sequence[str]) -> AdoptedProcess | None:
    """The recorded process as an adopted child if it still runs `argv`; if it runs but
    something else (the config changed), it is stopped, and None says: start afresh."""
    if recorded is None or start_ticks(recorded.pid) != recorded.ticks:
        return None
    if command_line(recorded.pid) == list(argv):
        return AdoptedProcess(recorded.pid, recorded.ticks)
    log.warning("%s %s (pid %d) runs another command than this config's; stopping it",
                recorded.kind, recorded.name, recorded.pid)  # fmt: skip
    stop_recorded(recorded)
    return None


def stop_recorded(recorded: Recorded) -> None:
    """SIGTERM the recorded child if it is still that process; SIGKILL after a grace."""
    stop(AdoptedProcess(recorded.pid, recorded.ticks))
