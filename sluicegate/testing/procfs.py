"""A process's CPU, memory and children, read from /proc; CPU summed per role."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()  # fields from the 3rd (state) on


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (not its children)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def exact_cpu_seconds(pid: int) -> float:
    """The CPU seconds the process has used, every thread, to the nanosecond: the
    kernel's CPU clock of the process (clock_getcpuclockid's id: the pid inverted, shifted
    by 3, or 2 for "sched"). /proc's figures count clock ticks (10 ms), too coarse for a
    few hundred requests."""
    return time.clock_gettime((~pid << 3) | 2)


def sys_seconds(pid: int) -> float:
    """System (kernel) CPU seconds of a process."""
    return int(_stat_fields(pid)[12]) / _CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """Resident set size now."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is pid."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry.name))[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def cpu_by_role(
    pids: Mapping[str, Iterable[int]], merge: Mapping[str, str] | None = None
) -> dict[str, float]:
    """CPU seconds used so far per role, summed over the role's processes (a process that
    has exited counts nothing). `merge` renames roles, so several count as one."""
    totals: dict[str, float] = {}
    for role, members in pids.items():
        name = (merge or {}).get(role, role)
        totals.setdefault(name, 0.0)
        for pid in members:
            with contextlib.suppress(OSError):
                totals[name] += cpu_seconds(pid)
    return totals


def _resource_tracker(pid: int) -> bool:
    """multiprocessing's resource tracker (spawn context) lives until this process exits."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def running_children() -> list[int]:
    """This process's children still running at the end of a run (the resource tracker of
    multiprocessing aside): a benchmark that leaves any failed to stop what it started."""
    return [pid for pid in children_of(os.getpid()) if alive(pid) and not _resource_tracker(pid)]
