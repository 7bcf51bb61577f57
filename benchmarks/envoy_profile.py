"""Where one arm's Envoy spends its CPU at full load, by shared object (perf).

Not collected by pytest. Run:  python -m benchmarks.envoy_profile "ARM" [--seconds S]

ARM is one of native_filter_cost's arms (its ARM_NAMES; their Envoys are built as that
benchmark builds them, the experiment's library on the search path). Envoy (one worker,
on ENVOY_CORE) serves wrk at concurrency 32 (on LOAD_CORE, with the fixed-answer
upstream); after 2 s of load, `perf record` samples the Envoy process for S seconds, and
`perf report --sort dso` says what share of its samples fell in each object: Envoy's own
code, the kernel, libc, sluicegate's native library. Envoy's binary keeps only its
dynamic symbols, so its own share cannot be split by function here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.fast_lane_cost import MODEL, wrk_script
from benchmarks.harness.processes import ENVOY_CORE, LOAD_CORE, pin, stop_tree, wait_listening
from benchmarks.native_filter_cost import ARM_NAMES, SEARCH_PATH, arm_bootstrap, build
from sluicegate.envoy import EnvoyProcess
from sluicegate.testing import free_ports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("arm", choices=ARM_NAMES)
    parser.add_argument("--seconds", type=int, default=6)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="envoy-profile-"))
    (work / "lib").mkdir()
    os.environ[SEARCH_PATH] = str(build(work / "lib").parent)
    upstream, port, unused = free_ports(3)
    fixed = subprocess.Popen(
        ["taskset", "-c", LOAD_CORE, sys.executable, "-m", "sluicegate.bench.fixed_upstream",
         "--port", str(upstream), "--model", MODEL, "--output-tokens", "20", "--workers", "1"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    bootstrap = arm_bootstrap(args.arm, work, upstream, port, unused)
    envoy = EnvoyProcess(bootstrap, work_dir=work / "envoy", concurrency=1)
    envoy.start_blocking()
    assert envoy.pid is not None
    pin(envoy.pid, ENVOY_CORE)
    try:
        wait_listening(upstream, 30.0)
        wait_listening(port, 30.0)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        load = subprocess.Popen(
            ["taskset", "-c", LOAD_CORE, "wrk", "-c32", "-t1", f"-d{args.seconds + 4}s",
             "-s", str(wrk_script(work, 1200)), url],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(2)
        data = work / "perf.data"
        subprocess.run(
            ["perf", "record", "-F", "2000", "-p", str(envoy.pid), "-o", str(data), "--",
             "sleep", str(args.seconds)],
            capture_output=True, check=True,
        )  # fmt: skip
        rate = [line for line in load.communicate()[0].splitlines() if "Requests/sec" in line]
        report = subprocess.run(
            ["perf", "report", "-i", str(data), "--sort", "dso", "--stdio"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        envoy.stop_blocking()
        stop_tree(fixed)
    print(f"{args.arm}: {' '.join(rate)}")
    print("\n".join(line for line in report.splitlines() if "%" in line and "#" not in line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
