"""Where a governed request's CPU goes, process by process: the fast lane against the auto
lane (docs/fast-lane.md, "What it costs").

Not collected by pytest. Run:  python -m benchmarks.lane_cpu [--rounds N] [--seconds S]

Each peer is the comparison's (benchmarks/peers/sluicegate_stack.py): `sluicegate up`
with one Envoy worker, one ext_proc process and the control plane, in front of the
fixed-answer upstream of `sluicegate bench` (its own process). `fast-admission` is one
tenant in the fast lane, `auto-admission` the same tenant `lane: auto`, far from its
limits (so in the fast lane: the lane log, the running records, the charges into the
exact lane's windows and the steering are what it adds). Per round and peer, `sluicegate
bench` drives non-streamed requests at concurrency 32 for `--seconds`; each process's
user and system CPU over the run (/proc) is divided by the requests answered. The peers
in turn, the order rotating; medians of rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.comparison.plan import Phase
from benchmarks.comparison.step import bench_spec
from benchmarks.comparison.upstream import start_upstream
from benchmarks.harness.processes import cpu_seconds
from benchmarks.harness.results import machine, today
from benchmarks.peers.peer import Upstream
from benchmarks.peers.sluicegate_stack import Kind, SluicegateStack
from sluicegate.bench.runner import run_bench_sync

KINDS: tuple[Kind, ...] = ("fast-admission", "auto-admission")
# What each process of `sluicegate up` is, by its command line.
ROLES: tuple[tuple[str, str], ...] = (
    ("envoy", "bin/envoy "),
    ("ext_proc", " ext-proc "),
    ("control plane", " control-plane "),
)
CONCURRENCY = 32


def _role(pid: int) -> str:
    command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    return next((role for role, mark in ROLES if mark in command), "other")


def _one_run(kind: Kind, work: Path, upstream: Upstream, seconds: float) -> dict[str, float]:
    """µs of CPU per answered request, by role, and requests/s, for one run of `kind`."""
    peer = SluicegateStack(work, kind=kind).start(upstream)
    try:
        pids = peer.pids()
        before = {pid: cpu_seconds(pid) for pid in pids}
        spec = bench_spec(peer, CONCURRENCY, False, Phase(warmup_s=1.0, duration_s=seconds))
        figures = run_bench_sync(spec).to_json()
        used: dict[str, float] = {}
        for pid in pids:
            try:
                spent = cpu_seconds(pid) - before[pid]
            except FileNotFoundError:
                continue
            used[_role(pid)] = used.get(_role(pid), 0.0) + spent
    finally:
        peer.stop()
    answered = figures["requests"]["ok"]
    result = {role: spent / answered * 1e6 for role, spent in used.items()}
    result["requests/s"] = answered / seconds
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    runs: dict[Kind, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="lane-cpu-") as tmp:
        work = Path(tmp)
        upstream = start_upstream(work)
        try:
            for round_ in range(args.rounds):
                order = KINDS[round_ % len(KINDS) :] + KINDS[: round_ % len(KINDS)]
                for kind in order:
                    runs[kind].append(_one_run(kind, work, upstream.upstream, args.seconds))
        finally:
            upstream.stop()
    print(f"{today()}; {machine()}; concurrency {CONCURRENCY}, {args.seconds:g} s a run, "
          f"{args.rounds} rounds (medians)\n")  # fmt: skip
    roles = [role for role, _ in ROLES] + ["other"]
    print("| peer | req/s | " + " | ".join(f"{role} µs/req" for role in roles) + " | total |")
    print("|---|---:|" + "---:|" * (len(roles) + 1))
    for kind in KINDS:
        median = {
            key: statistics.median(run.get(key, 0.0) for run in runs[kind])
            for key in (*roles, "requests/s")
        }
        cells = " | ".join(f"{median[role]:,.0f}" for role in roles)
        total = sum(median[role] for role in roles)
        print(f"| sluicegate-{kind} | {median['requests/s']:,.0f} | {cells} | {total:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
