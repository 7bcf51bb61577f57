"""Benchmark: every gateway of issue 11 side by side, in one session, against one
upstream, driven by `sluicegate bench`'s engine.

    python -m benchmarks.compare_gateways [--rounds N] [--only NAME ...] [--quick]
        [--write] [--json FILE] [--upstream-workers W] [--keep]
    python -m benchmarks.compare_gateways --from-json FILE [--write]

The peers (benchmarks/peers): direct (the upstream itself: the limit, always run),
envoy, sluicegate-routing, sluicegate-fast-routing, sluicegate-admission,
sluicegate-fast-admission, litellm-1,
litellm-N (N = cores),
portkey, installed on first use under .bench-peers/. The upstream is the fixed-answer
server of sluicegate.bench in a process of its own. Measured per peer and round
(benchmarks/comparison/peer_round.py): added latency at concurrency 1; a non-streamed
concurrency sweep (published in full) and from it the throughput frontier; CPU per
request of the peer's whole process tree, the upstream's and the generator's; a paced
stream's added TTFT and inter-chunk latency and the concurrent streams sustained; RSS
idle, under load and after. Rounds rotate the order; differences and ratios are taken
within a round, medians across rounds. The full plan took 28 minutes on 2 cores (3 rounds),
`--quick` (1 round, short and fewer steps) under 5.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.comparison.dump import load, save
from benchmarks.comparison.peer_round import PeerRound, measure_peer
from benchmarks.comparison.plan import FULL, QUICK, Plan
from benchmarks.comparison.report import HEADING, RunInfo, section
from benchmarks.comparison.summary import DIRECT, Rounds
from benchmarks.comparison.tables import ms, number
from benchmarks.comparison.upstream import start_upstream
from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.results import machine, today
from benchmarks.peers import Peer, peers
from benchmarks.peers.peer import ROOT
from sluicegate.bench.loops import new_event_loop


def _one_line(result: PeerRound) -> str:
    if result.failure:
        return f"   FAILED: {result.failure}"
    best = max((s.requests_per_s for s in result.sweep if s.failed == 0), default=0.0)
    latency = result.latency
    stream = result.stream
    return (
        f"   c=1 p50 {ms(latency.e2e_p50 if latency else None)} ms; most req/s with no "
        f"failure {number(best)}; stream ITL p99 {ms(stream.itl_p99 if stream else None)} ms; "
        f"streams sustained {result.streams_sustained} ({result.streams_stop})"
    )


async def _rounds(
    catalog: dict[str, Peer], names: Sequence[str], plan: Plan, upstream_workers: int, work: Path
) -> tuple[list[PeerRound], str, list[float]]:
    """Every round; returns the results, the upstream's command line and the load
    average at each round's start."""
    upstream = start_upstream(work, upstream_workers)
    upstream_pids = upstream.pids()  # once: see comparison/step.py
    results: list[PeerRound] = []
    loads = []
    try:
        for index in range(plan.rounds):
            shift = index % len(names)
            order = [*names[shift:], *names[:shift]]
            loads.append(os.getloadavg()[0])
            print(f"round {index + 1}/{plan.rounds} (load average {loads[-1]:.2f}): "
                  f"{', '.join(order)}", flush=True)  # fmt: skip
            for position, name in enumerate(order):
                started = time.monotonic()
                result = await measure_peer(catalog[name], upstream.upstream, upstream_pids,
                                            plan, index + 1, position)  # fmt: skip
                results.append(result)
                print(f"  {name}: {time.monotonic() - started:.0f} s", flush=True)
                print(_one_line(result), flush=True)
    finally:
        upstream.stop()
    return results, upstream.command, loads


def _commit() -> str | None:
    """HEAD, and whether sluicegate/ differs from it (what was measured)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        changed = subprocess.run(["git", "status", "--porcelain", "--", "sluicegate"], cwd=ROOT,
                                 check=True, capture_output=True, text=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + (" with uncommitted changes in sluicegate/" if changed.strip() else "")


def _record(info: RunInfo, results: list[PeerRound], write: bool) -> None:
    names = list(info.versions)  # the catalog's order
    litellms = [n for n in names if n.startswith("litellm-")]
    record(HEADING, section(Rounds(results), names, litellms, info), write)


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--rounds", type=int, help="rounds (default: 3; --quick: 1)")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="these peers only (direct is always run)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="1 round, short and fewer steps: for development")  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="FILE", help="every step's figures")
    parser.add_argument("--upstream-workers", type=int, default=1,
                        help="processes of the fixed upstream")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--from-json", type=Path, metavar="FILE",
                        help="measure nothing: the section of a run's --json FILE")  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_json is not None:
        info, results = load(args.from_json)
        _record(info, results, args.write)
        return 0
    plan = QUICK if args.quick else FULL
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be >= 1")
        plan = dataclasses.replace(plan, rounds=args.rounds)
    work = Path(tempfile.mkdtemp(prefix="compare-gateways-"))
    catalog = peers(work)
    if unknown := set(args.only or []) - set(catalog):
        parser.error(f"unknown peers {sorted(unknown)}; known: {', '.join(catalog)}")
    names = [n for n in catalog if n == DIRECT or args.only is None or n in args.only]
    for name in names:
        catalog[name].install()
    versions = {name: catalog[name].version() for name in names}
    started, load_before = time.monotonic(), os.getloadavg()[0]
    print(f"work: {work}; load average {load_before:.2f}", flush=True)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        results, upstream, loads = runner.run(
            _rounds(catalog, names, plan, args.upstream_workers, work)
        )
    info = RunInfo(
        command=command_line("benchmarks.compare_gateways", argv), date=today(),
        machine=machine(), loads=[load_before, *loads[1:], os.getloadavg()[0]],
        duration_s=time.monotonic() - started, plan=plan, upstream=upstream,
        versions=versions, does={name: catalog[name].does for name in names},
        commit=_commit(),
    )  # fmt: skip
    _record(info, results, args.write)
    dump = args.json or work / "compare-gateways.json"
    save(dump, info, results)
    print(f"every step's figures: {dump}")
    if args.keep or args.json is None:
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r.failure for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
