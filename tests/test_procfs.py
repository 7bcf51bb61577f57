"""The benchmarks' reading of another process's CPU (sluicegate.testing.procfs)."""

from __future__ import annotations

import subprocess
import sys
import time

from sluicegate.testing import cpu_seconds, exact_cpu_seconds


def test_exact_cpu_seconds_reads_another_process() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
         "while time.process_time() < end: pass\ntime.sleep(30)"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while exact_cpu_seconds(child.pid) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        used = exact_cpu_seconds(child.pid)
        # Spun 0.3 s (plus its start), then sleeps: the clock stops, ticks agree.
        assert 0.3 <= used < 5
        time.sleep(0.2)
        assert exact_cpu_seconds(child.pid) - used < 0.05
        assert abs(cpu_seconds(child.pid) - used) <= 0.05  # /proc's ticks agree
    finally:
        child.kill()
        child.wait()
