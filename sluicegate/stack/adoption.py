"""Taking over a stack whose `up` died: its children serve on, the next `up` adopts them.

`up` starts its children in sessions of their own and without a parent-death signal,
so a `kill -9` (or an OOM kill) of `up` stops no traffic: Envoy, the control plane,
the ext_proc servers and the mocks keep running. `up` records each child in its work
directory's `stack.json` (pid, start time, argv) as soon as it is started (so a
`kill -9` of `up` while others start still leaves every started child recorded). The
next `up` on the same work directory (the default one is the same for the same config
file) adopts every recorded child that is still the very process it recorded (same
start time) running the very command it would start now, with the same values of the
environment variables that carry its keys (`ChildSpec.matched_env`: a key rotated by
restarting `up` with a new value must reach the child); it stops one that differs (the
config or a key changed while `up` was gone) and starts the rest. An adopted child is
not `up`'s own: its exit status is not known, so it is logged as unknown.

docs/operations.md, "When a process dies".
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
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


def _environment(pid: int, names: Sequence[str]) -> dict[str, bytes] | None:
    """The values `names` had in the environment the process was started with (absent
    names left out), or None if it cannot be read. Values are keys: compared, never kept."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    wanted = {name.encode() for name in names}
    found: dict[str, bytes] = {}
    for entry in raw.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and name in wanted:
            found[name.decode()] = value
    return found


def _same_environment(pid: int, expected: Mapping[str, str | None]) -> bool:
    """Whether the process was started with `expected`'s values (None: unset)."""
    if not expected:
        return True
    found = _environment(pid, list(expected))
    if found is None:
        return False  # cannot tell: start afresh rather than keep a stale key
    return all(
        (value is None and name not in found)
        or (value is not None and hmac.compare_digest(found.get(name, b""), value.encode()))
        for name, value in expected.items()
    )


class AdoptedProcess:
    """A process `up` did not start but now supervises; its exit status is unknowable
    (its parent is init now), so `poll()` says only whether it still runs."""

    UNKNOWN_EXIT: Final = -1000  # what poll() says once it has exited; never shown

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

    @classmethod
    def of(cls, kind: str, name: str, pid: int, argv: Sequence[str]) -> Recorded | None:
        """The running process `pid` as a record, or None if it is gone."""
        ticks = start_ticks(pid)
        return None if ticks is None else cls(kind, name, pid, ticks, list(argv))


def record(work_dir: Path, children: Sequence[Recorded]) -> None:
    """Write `stack.json` whole (write, then rename): each child `up` knows of."""
    partial = work_dir / (STATE_FILE + ".partial")
    partial.write_text(json.dumps({"children": [asdict(child) for child in children]}))
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


def recorded_children(work_dir: Path) -> dict[tuple[str, str], Recorded]:
    found: dict[tuple[str, str], Recorded] = {}
    for entry in _read(work_dir).get("children", []):
        with contextlib.suppress(TypeError):
            child = Recorded(**entry)
            found[(child.kind, child.name)] = child
    return found


def still_running(recorded: Recorded) -> bool:
    """Whether the recorded process is still that very process (pids are reused)."""
    return start_ticks(recorded.pid) == recorded.ticks


def adopt(
    recorded: Recorded | None,
    argv: Sequence[str],
    expected_env: Mapping[str, str | None] | None = None,
) -> AdoptedProcess | None:
    """The recorded process as an adopted child if it still runs `argv` and was started
    with `expected_env`'s values (None: unset); if it runs but differs (the config or a
    key changed), it is stopped, and None says: start afresh."""
    if recorded is None or not still_running(recorded):
        return None
    if command_line(recorded.pid) != list(argv):
        differs = "runs another command than this config's"
    elif not _same_environment(recorded.pid, expected_env or {}):
        # Names only: the values are keys.
        differs = "was started with other values of " + ", ".join(sorted(expected_env or {}))
    else:
        return AdoptedProcess(recorded.pid, recorded.ticks)
    log.warning("%s %s (pid %d) %s; stopping it", recorded.kind, recorded.name,
                recorded.pid, differs)  # fmt: skip
    stop_recorded(recorded)
    return None


def stop_recorded(recorded: Recorded) -> None:
    """SIGTERM the recorded child if it is still that process; SIGKILL after a grace."""
    stop(AdoptedProcess(recorded.pid, recorded.ticks))
