"""Benchmark: how long a full garbage collection stalls a serving ext_proc process.

    python -m benchmarks.collector_pauses [--write] [--reservations 15000] [--runs 5]

Each measurement runs in a fresh process that does what `sluicegate up` and
`sluicegate ext-proc` do before serving: imports the whole stack, loads
examples/quickstart.yaml into a started ExtProcServer (grpc.aio on uvloop). Then,
as traffic would, it fills a memory limiter store with `--reservations` live
reservations on two limits (a minute of traffic at 250 requests/s), and times
`gc.collect(2)`, a full collection, five times (the median is reported).

- defaults: CPython's collector as it comes;
- settled: `settle_heap()` (sluicegate.stack.heap) ran once the server was up, as
  `up` and `ext-proc` now do: what was alive then is frozen, out of every collection.

A full collection runs when the objects that survived younger collections reach a
quarter of the old ones, so with the defaults its cost recurs as long as traffic
makes long-lived objects (reservations live one window); every request in flight
waits for it.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.results import machine, today

ROOT: Final = Path(__file__).resolve().parent.parent
QUICKSTART: Final = ROOT / "examples" / "quickstart.yaml"
MODES: Final = ("defaults", "settled")


def _full_collection_ms(times: int) -> list[float]:
    found = []
    for _ in range(times):
        started = time.perf_counter()
        gc.collect(2)
        found.append((time.perf_counter() - started) * 1e3)
    return found


async def _child(mode: str, reservations: int) -> dict[str, Any]:
    """One serving process: start as `up` would, settle or not, then take traffic."""
    import sluicegate.stack.up  # noqa: F401  (the whole stack, as `up` imports it)
    from sluicegate.filters import ExtProcServer
    from sluicegate.filters.limiter import Limit, MemoryStore, Usage
    from sluicegate.stack.heap import settle_heap
    from sluicegate.stack.replica import load_into

    server = ExtProcServer()
    if not load_into(server, QUICKSTART):
        raise SystemExit(f"cannot load {QUICKSTART}")
    await server.start("127.0.0.1:0")
    try:
        frozen = settle_heap() if mode == "settled" else 0
        store = MemoryStore()
        limits = [
            Limit("tenant", "bench", "tokens", 10**12, 60.0),
            Limit("tenant", "bench", "requests", 10**9, 60.0),
        ]
        for index in range(reservations):
            await store.reserve(f"r{index}", limits, Usage(40, 16))
        pauses = _full_collection_ms(5)
        # What a full collection walks once it has run (it stops tracking tuples of atoms).
        tracked = len(gc.get_objects())
        return {"mode": mode, "frozen": frozen, "tracked": tracked, "pauses_ms": pauses}
    finally:
        await server.stop(0)


def _measure(mode: str, reservations: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.collector_pauses", "--child", mode]
    argv += ["--reservations", str(reservations)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def report(runs: list[dict[str, Any]], reservations: int, command: str) -> str:
    header = f"{today()}; {machine()}."
    out = [f"`{command}` — {header}", "", (__doc__ or "").split("\n\n", 2)[2].strip(), ""]
    out += [
        "| collector | objects frozen | objects a full collection walks | "
        "full collection ms, median of runs | per run (median of 5) |",
        "|---|---:|---:|---:|---|",
    ]
    medians: dict[str, float] = {}
    for mode in MODES:
        mine = [run for run in runs if run["mode"] == mode]
        per_run = [statistics.median(run["pauses_ms"]) for run in mine]
        medians[mode] = statistics.median(per_run)
        walked = statistics.median(run["tracked"] for run in mine)
        out.append(
            f"| {mode} | {mine[0]['frozen']:,} | {walked:,.0f} "
            f"| {medians[mode]:.1f} | {', '.join(f'{v:.1f}' for v in per_run)} |"
        )
    ratio = medians["defaults"] / max(medians["settled"], 1e-3)
    out += [
        "",
        f"With {reservations:,} live reservations, a full collection takes "
        f"{medians['defaults']:.1f} ms with CPython's defaults and {medians['settled']:.1f} ms "
        f"once the start-up heap is frozen ({ratio:.0f}x shorter).",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--reservations", type=int, default=15_000)
    parser.add_argument("--runs", type=int, default=5, help="processes per collector mode")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import uvloop

        print(json.dumps(uvloop.run(_child(args.child, args.reservations))))
        return 0
    runs = []
    for index in range(args.runs):
        for mode in MODES if index % 2 == 0 else MODES[::-1]:
            run = _measure(mode, args.reservations)
            print(f"run {index + 1} {mode}: {statistics.median(run['pauses_ms']):.1f} ms, "
                  f"{run['tracked']:,} objects walked", flush=True)  # fmt: skip
            runs.append(run)
    command = command_line("benchmarks.collector_pauses", argv)
    record("Collector pauses", report(runs, args.reservations, command), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
