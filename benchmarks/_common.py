"""Helpers shared by the benchmarks: free ports, a process's RSS and CPU from
/proc, stopping process trees, percentiles, and updating one section of
benchmarks/RESULTS.md. Linux only (reads /proc); no third-party packages.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# One helper for tests and benchmarks (re-exported for the benchmark scripts).
from tests.ports import free_port as free_port
from tests.ports import free_ports as free_ports

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


# ----- ports -------------------------------------------------------------------------------


def wait_listening(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


# ----- /proc -------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()  # fields from the 3rd (state) on


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (not its children)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


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


# ----- statistics --------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


# ----- reporting ---------------------------------------------------------------------------


def machine() -> str:
    """One line about the machine: cores, CPU model, memory, kernel, Python."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{os.cpu_count()} cores ({model}){memory}, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """How a run was asked for, for RESULTS: `python -m <module> <its arguments>`."""
    given = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m " + module, *given])


def today() -> str:
    return datetime.date.today().isoformat()


def update_section(heading: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) the `## heading` section of RESULTS.md with `body`,
    leaving every other section as it was."""
    title = f"## {heading}"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(title)}[ \t]*\n.*?(?=^## |\Z)", re.M | re.S)
    section = f"{title}\n\n{body.strip()}\n\n"
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")
