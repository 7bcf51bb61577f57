"""Benchmark: what admission (issue 4) costs on the request path, what the usage observer
costs per streamed chunk, whether token limits over-admit at the real window, and what a
priority gate does under overload.

Not collected by pytest. Run from the repository root (venv active, Envoy and
redis-server on PATH):

    python -m benchmarks.admission --write          # every part (~5-6 min on 2 cores)
    python -m benchmarks.admission --part cost      # one part, printed only

Parts (`--part NAME`, repeatable; `--write` needs all four):

cost      The real ExtProcServer in its own process (uvloop), driven over gRPC as Envoy
          drives it (headers message, then body message, per stream, 64 streams at once):
          (a) routing only, (b) a tenant key + tokens + requests limits on the memory
          store, (c) the same on Redis (a real redis-server), (d) (b) + a route
          concurrency gate that never blocks. Requests/s at saturation and server CPU
          µs/request; per round ratios to (a), rounds in rotated order. Then a stress probe
          (the Redis variant with the default store settings, 256 streams) and the pieces
          of the stage timed in this process.
observer  CPU per response_body message of the usage stage (observability mode: metadata
          with the reservation on every message, a ~300-byte SSE chunk per token, a final
          usage chunk), driven over gRPC; then a real Envoy (`sluicegate up`, mock provider
          50 tokens, ITL 10 ms) streaming to 16 clients with the observer on (token limits)
          vs off (requests limit only): client-side TTFT, inter-chunk gaps, totals.
window    One tenant limited to 10,000 tokens per minute, 32 clients for two minutes, 4
          ext_proc replicas sharing Redis (fail_closed), answers using all of max_tokens:
          tokens admitted per window, the worst sliding window, refusals, 429 latency.
          `--window-per 20` runs 20 s windows instead (and says so).
priority  A route gated at 4 requests (headroom 0.25) in front of one mock provider (TTFT
          200 ms), 8 interactive + 16 batch closed-loop clients honouring Retry-After;
          the same load on an ungated route and on a route limited only by Envoy's pool
          (`max_connections: 4`, FIFO).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.admission_e2e import (
    OBS_ITL_MS,
    OBS_LABELS,
    OBS_TOKENS,
    OBS_TTFT_MS,
    OBS_VARIANTS,
    PRIO_CLASSES,
    PRIO_LABELS,
    PRIO_PHASES,
    PRIO_TTFT_MS,
    REFUSED_PAUSE_S,
    SLACK_S,
    WINDOW_LIMIT,
    WINDOW_MAX_TOKENS,
    ObserverE2E,
    PriorityResult,
    WindowResult,
    queue_quantiles,
    run_observer_e2e,
    run_priority,
    run_window,
)
from benchmarks.admission_grpc import (
    BESIDE_ITL_S,
    BESIDE_SLICE_S,
    BESIDE_STREAMS,
    OBSERVER_LABELS,
    OBSERVER_VARIANTS,
    VARIANT_LABELS,
    VARIANTS,
    CostResult,
    ObserverMicro,
    run_cost,
    run_observer_micro,
)
from benchmarks.harness.cli import benchmark_parser, command_line
from benchmarks.harness.results import machine, today, update_section
from benchmarks.harness.stats import percentile
from sluicegate.testing import RedisServer, children_of, running_children

SECTION = "Admission"
PARTS = ("cost", "observer", "window", "priority")
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Results:
    cost: CostResult | None = None
    micro: ObserverMicro | None = None
    e2e: list[ObserverE2E] | None = None
    window: WindowResult | None = None
    priority: PriorityResult | None = None
    elapsed_s: float = 0.0
    part_s: dict[str, float] | None = None
    loads: tuple[float, float] = (0.0, 0.0)


def run(parts: Sequence[str], args: argparse.Namespace, work: Path) -> Results:
    results = Results(part_s={})
    assert results.part_s is not None
    with RedisServer() as redis:
        redis_pid = _redis_pid()
        if "cost" in parts:
            started = time.monotonic()
            print("part 1: cost of admission on the request path ...", flush=True)
            results.cost = run_cost(
                redis.url, redis_pid, args.rounds, args.requests, args.streams, work
            )
            results.part_s["cost"] = time.monotonic() - started
        if "observer" in parts:
            started = time.monotonic()
            print("part 2a: usage observer, CPU per chunk ...", flush=True)
            results.micro = run_observer_micro(3, 200, 32, OBS_TOKENS, work)
            print("part 2b: usage observer end to end ...", flush=True)
            levels = [(16, args.observer_round_s), (4, args.observer_round_s * 0.8)]
            results.e2e = run_observer_e2e(work, levels, 4)
            results.part_s["observer"] = time.monotonic() - started
        if "window" in parts:
            started = time.monotonic()
            print(f"part 3: over-admission, {args.window_per:g} s windows ...", flush=True)
            results.window = run_window(work, args.window_per, 32, 2, 4, redis.url)
            results.part_s["window"] = time.monotonic() - started
        if "priority" in parts:
            started = time.monotonic()
            print("part 4: priority under overload ...", flush=True)
            results.priority = run_priority(work, {"interactive": 8, "batch": 16}, args.priority_s)
            results.part_s["priority"] = time.monotonic() - started
    return results


def _redis_pid() -> int | None:
    for pid in children_of(os.getpid()):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip().startswith("redis-server"):
                return pid
        except OSError:
            continue
    return None


# ----- formatting --------------------------------------------------------------------------


def _ms(seconds: float | None, digits: int = 1) -> str:
    if seconds is None or seconds != seconds:
        return "—"
    return f"{seconds * 1e3:.{digits}f}"


def _range(values: Sequence[float]) -> str:
    return f"{min(values):.0f}-{max(values):.0f}" if values else "—"


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _git() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            text=True,
            capture_output=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"commit {head}" + (" with uncommitted changes to tracked files" if dirty else "")


def _envoy_version() -> str:
    try:
        text = subprocess.run(
            ["envoy", "--version"], text=True, capture_output=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "Envoy"
    for word in text.split():
        if word.count("/") >= 1 and word.split("/")[1][:1].isdigit():
            return "Envoy " + word.split("/")[1]
    return "Envoy"


# ----- part 1 ------------------------------------------------------------------------------


def cost_tables(cost: CostResult) -> list[str]:
    lines = [
        "| configuration | req/s | req/s x (a) | server CPU µs/req (range) | of which kernel | "
        "CPU x (a) "
        "| added µs/req vs (a) | redis-server CPU µs/req | server busy (cores) | answers not "
        "routed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant in VARIANTS:
        rows = cost.of(variant)
        rps = percentile([r.rps for r in rows], 50)
        cpu = percentile([r.server_us for r in rows], 50)
        base = variant == VARIANTS[0]
        lines.append(
            f"| {VARIANT_LABELS[variant]} | {rps:.0f} | "
            f"{'1.00x' if base else _x(cost.ratio(variant, 'rps'))} | {cpu:.0f} "
            f"({_range([r.server_us for r in rows])}) | "
            f"{percentile([r.server_sys_us for r in rows], 50):.0f} | "
            f"{'1.00x' if base else _x(cost.ratio(variant, 'server_us'))} | "
            f"{'—' if base else f'+{cost.added_us(variant):.0f}'} | "
            f"{percentile([r.redis_us for r in rows], 50):.0f} | "
            f"{percentile([r.server_busy for r in rows], 50):.2f} | "
            f"{sum(r.not_routed for r in rows)} |"
        )
    lines += [
        "",
        "Where the time goes: the stage's pieces timed in the benchmark process on the real "
        "objects, in CPU time (`time.process_time`; no gRPC; best of 3 runs of 1,000 calls; "
        "os.times() for Redis, 10 ms ticks). *whole stage*: `AdmissionStream.on_message` "
        "for the headers and "
        "the body message plus `close()`, per request, on already-parsed messages. The "
        "server's CPU per request in the table above minus the whole stage is gRPC "
        "(grpc.aio: a stream opened, two messages read, two answers written, the stream "
        "closed).",
        "",
        "| piece | CPU µs per call |",
        "|---|---:|",
    ]
    for variant in VARIANTS:
        lines.append(
            f"| whole stage, {VARIANT_LABELS[variant][4:]} | "
            f"{cost.breakdown[f'stage:{variant}']:.0f} |"
        )
    for name, value in cost.breakdown.items():
        if not name.startswith("stage:"):
            lines.append(f"| {name} | {value:.1f} |")
    return lines


# ----- part 2 ------------------------------------------------------------------------------


def micro_table(micro: ObserverMicro) -> list[str]:
    lines = [
        "| usage stage stream | body messages | msgs/s | server CPU µs per body message "
        "(median; range over rounds) |",
        "|---|---:|---:|---:|",
    ]
    for variant in OBSERVER_VARIANTS:
        rows = micro.rows(variant)
        lines.append(
            f"| {OBSERVER_LABELS[variant]} | {sum(r.body_messages for r in rows)} | "
            f"{percentile([r.messages_per_s for r in rows], 50):.0f} | "
            f"{percentile([r.us_per_body_message for r in rows], 50):.0f} "
            f"({_range([r.us_per_body_message for r in rows])}) |"
        )
    lines += ["", "| piece, in the benchmark process | CPU µs per body message |", "|---|---:|"]
    for name, value in micro.breakdown.items():
        lines.append(f"| {name} | {value:.1f} |")
    idle, busy = micro.routing_idle, micro.routing_observing
    rate = percentile(micro.beside_chunks_per_s, 50)
    lines += [
        "",
        f"Routing beside the observer: one routing request at a time (headers + body round "
        f"trips, 5 ms apart) on the same server, idle vs while it observes {BESIDE_STREAMS} "
        f"streams sending a chunk every {BESIDE_ITL_S * 1e3:.0f} ms each ({rate:.0f} "
        f"chunks/s measured; the end-to-end part's load); 2 x {BESIDE_SLICE_S:g} s each, "
        "alternated.",
        "",
        "| server | routing requests | latency p50 / p90 / p99 (ms) |",
        "|---|---:|---:|",
        f"| idle | {len(idle)} | {_ms(percentile(idle, 50), 2)} / {_ms(percentile(idle, 90), 2)}"
        f" / {_ms(percentile(idle, 99), 2)} |",
        f"| observing {rate:.0f} chunks/s | {len(busy)} | {_ms(percentile(busy, 50), 2)} / "
        f"{_ms(percentile(busy, 90), 2)} / {_ms(percentile(busy, 99), 2)} |",
    ]
    return lines


def e2e_table(levels: list[ObserverE2E]) -> list[str]:
    lines = [
        "| clients | variant | streams | TTFT p50 / p99 (ms) | gap between chunks p50 / p99 (ms) | "
        "total p50 / p99 (ms) | CPU per stream, ms: `up` (ext_proc) / Envoy | usage "
        "reports seen by the observer | failures |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for e2e in levels:
        lines += _e2e_rows(e2e)
    return lines


def _e2e_rows(e2e: ObserverE2E) -> list[str]:
    lines = []
    for variant in OBS_VARIANTS:
        samples = e2e.samples[variant]
        gaps = e2e.all_gaps(variant)
        count = max(1, len(samples))
        cpu = e2e.cpu_s[variant]
        lines.append(
            f"| {e2e.clients} | {OBS_LABELS[variant]} | {len(samples)} | "
            f"{_ms(percentile([s.ttft_s for s in samples], 50))} / "
            f"{_ms(percentile([s.ttft_s for s in samples], 99))} | "
            f"{_ms(percentile(gaps, 50), 2)} / {_ms(percentile(gaps, 99), 2)} | "
            f"{_ms(percentile([s.total_s for s in samples], 50), 0)} / "
            f"{_ms(percentile([s.total_s for s in samples], 99), 0)} | "
            f"{cpu.get('up', 0) / count * 1e3:.2f} / {cpu.get('envoy', 0) / count * 1e3:.2f} | "
            f"{e2e.usage_reports.get(variant, 0):.0f} | "
            f"{dict(e2e.failures[variant]) or '—'} |"
        )
    ratios = {k: percentile(v, 50) for k, v in e2e.round_ratios.items()}
    lines.append(
        f"| {e2e.clients} | on / off (median of per-round ratios) | | "
        f"{_x(ratios['ttft_p50'])} (p50) | "
        f"{_x(ratios['gap_p50'])} / {_x(ratios['gap_p99'])} | {_x(ratios['total_p50'])} "
        "(p50) | | | |"
    )
    return lines


# ----- part 3 ------------------------------------------------------------------------------


def window_tables(window: WindowResult) -> list[str]:
    per = window.per_s
    admitted = window.admitted()
    lines = [
        "| window (by send time) | requests admitted | tokens admitted (real usage) | "
        "limit | bound: limit + one estimate |",
        "|---|---:|---:|---:|---:|",
    ]
    for index, (tokens, requests) in enumerate(window.fixed_windows()):
        lines.append(
            f"| {index * per:g}-{(index + 1) * per:g} s | {requests} | {tokens} | "
            f"{WINDOW_LIMIT} | {window.bound} |"
        )
    worst, at = window.worst_window(per)
    worst_slack, at_slack = window.worst_window(per - SLACK_S)
    statuses = Counter(o.status for o in window.outcomes)
    codes = Counter(o.code for o in window.outcomes if o.status != 200)
    refused = window.latencies(429)
    ok = window.latencies(200)
    lines += [
        "",
        "| figure | value |",
        "|---|---|",
        f"| worst sliding {per:g} s window (by send time) | {worst} tokens (from t = {at:.1f} s)"
        f" = {worst / WINDOW_LIMIT:.2f}x the limit |",
        f"| worst sliding {per - SLACK_S:g} s window (send-time slack {SLACK_S:g} s) | "
        f"{worst_slack} tokens (from t = {at_slack:.1f} s) = "
        f"{worst_slack / WINDOW_LIMIT:.2f}x the limit |",
        f"| worst sliding {per:g} s window by decision time (the limiter's own log in Redis, "
        f"polled every 2 s; {len(window.store_log)} charges seen, the start-up probe "
        "request included) | "
        f"{window.worst_store_window(per)} tokens = "
        f"{window.worst_store_window(per) / WINDOW_LIMIT:.2f}x the limit |",
        f"| bound (limit + one estimate: {window.estimate} = prompt estimate + max_tokens "
        f"{WINDOW_MAX_TOKENS}) | {window.bound} |",
        f"| requests admitted / refused (429) / other | {statuses.get(200, 0)} / "
        f"{statuses.get(429, 0)} / {sum(n for s, n in statuses.items() if s not in (200, 429))}"
        f" |",
        f"| answers other than 200 by code | {dict(codes) or '—'} |",
        f"| real usage per admitted request (mean) | "
        f"{sum(o.charged for o in admitted) / max(1, len(admitted)):.0f} tokens |",
        f"| 429 answer latency p50 / p99 | {_ms(percentile(refused, 50), 2)} / "
        f"{_ms(percentile(refused, 99), 2)} ms |",
        f"| 200 answer latency p50 / p99 (mock TTFT 30 ms) | {_ms(percentile(ok, 50), 1)} / "
        f"{_ms(percentile(ok, 99), 1)} ms |",
        f"| requests per ext_proc endpoint (Envoy `rq_total`) | "
        f"{', '.join(str(v) for v in sorted(window.hosts_used.values(), reverse=True))} |",
        f"| CPU s over the run: `up` / replicas / Envoy / mock | "
        f"{window.cpu_s.get('up', 0):.1f} / {window.cpu_s.get('replica', 0):.1f} / "
        f"{window.cpu_s.get('envoy', 0):.1f} / {window.cpu_s.get('mock', 0):.1f} |",
    ]
    return lines


# ----- part 4 ------------------------------------------------------------------------------


def priority_table(result: PriorityResult) -> list[str]:
    lines = [
        "| route | class (clients) | requests | admitted (200) | admitted/s | shed: queue_full "
        "/ queue_timeout / displaced | 503 with Retry-After | e2e p50 / p99 of 200s (ms) | "
        "queue time p50 / p95 / p99 from `/metrics` (ms) | client-side wait p50 / p99 (ms) "
        "| provider in flight max |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase_name in PRIO_PHASES:
        phase = result.phases.get(phase_name)
        if phase is None:
            continue
        for cls, clients in result.clients.items():
            outcomes = phase.of(cls)
            ok = [o for o in outcomes if o.status == 200]
            codes = Counter(o.code for o in outcomes if o.status == 503)
            with_retry = sum(1 for o in outcomes if o.status == 503 and o.retry_after)
            e2e = [o.done - o.sent for o in ok]
            waits = [
                (o.done - o.sent) - o.processing_ms / 1e3 for o in ok if o.processing_ms is not None
            ]
            if phase_name == "gated":
                q = queue_quantiles(phase.queue_buckets.get((cls, "admitted"), []))
                queue = " / ".join(_ms(v, 0) for v in q)
            else:
                queue = "— (no gate)"
            others = sum(1 for o in outcomes if o.status not in (200, 503))
            shed = (
                f"{codes.get('queue_full', 0)} / {codes.get('queue_timeout', 0)} / "
                f"{codes.get('queue_displaced', 0) + codes.get('displaced', 0)}"
            )
            lines.append(
                f"| {phase_name} | {cls} ({clients}) | {len(outcomes)} | {len(ok)} | "
                f"{len(ok) / phase.seconds:.1f} | {shed} | "
                f"{with_retry} of {sum(codes.values())} | "
                f"{_ms(percentile(e2e, 50), 0)} / {_ms(percentile(e2e, 99), 0)} | {queue} | "
                f"{_ms(percentile(waits, 50), 0)} / {_ms(percentile(waits, 99), 0)} | "
                f"{phase.provider_max_in_flight} |"
                + (f" ({others} other answers)" if others else "")
            )
    return lines


# ----- the reading -------------------------------------------------------------------------


def _times(count: int) -> str:
    return {1: "once", 2: "twice"}.get(count, f"{count} times")


def _store_down_reasons(lines: Sequence[str]) -> Counter[str]:
    return Counter(
        line.split("failed: ", 1)[-1].split(")")[0] for line in lines if "store down" in line
    )


def _why_down(reasons: Counter[str]) -> str:
    """What the logged reasons mean, for the reading (whole sentences)."""
    why = []
    if any("MaxConnections" in r for r in reasons):
        why.append(
            "The asyncio connection pool of redis-py holds 100 connections by default and "
            "raises MaxConnectionsError at once beyond that (each reserve in flight holds a "
            "connection)."
        )
    if any("Timeout" in r for r in reasons):
        why.append(
            "The default 100 ms store timeout (300 ms deadline per call) counts the "
            "event-loop lag of a busy replica and the time to open a new connection, and "
            "this machine's 2 cores were saturated."
        )
    return "".join(f"{text} " for text in why)


def reading(results: Results) -> list[str]:
    out: list[str] = []
    cost = results.cost
    if cost is not None:
        added = {v: cost.added_us(v) for v in VARIANTS[1:]}
        rps = {v: cost.ratio(v, "rps") for v in VARIANTS[1:]}
        redis_rows = cost.of("redis")
        memory_rows = cost.of("memory")
        kernel = {
            v: percentile([r.server_sys_us for r in cost.of(v)], 50) for v in ("memory", "redis")
        }
        out.append(
            f"- **Cost on the request path.** A tenant key with a tokens and a requests limit "
            f"adds {added['memory']:.0f} µs of ext_proc CPU per request on the memory store "
            f"({_x(cost.ratio('memory', 'server_us'))} the routing-only CPU; requests/s "
            f"{_x(rps['memory'])}), {added['gate']:.0f} µs with the never-blocking gate as "
            f"well ({_x(rps['gate'])}), and {added['redis']:.0f} µs on Redis "
            f"({_x(cost.ratio('redis', 'server_us'))}; requests/s {_x(rps['redis'])}), plus "
            f"{percentile([r.redis_us for r in redis_rows], 50):.0f} µs in redis-server "
            "(the Lua script). The in-process breakdown puts the whole stage at "
            f"{cost.breakdown['stage:memory']:.0f} µs on the memory store against "
            f"{cost.breakdown['stage:routing']:.0f} µs for routing only (pieces: "
            f"{cost.breakdown['inspect_request (scan the body, estimate prompt tokens)']:.0f} µs "
            "reading the body and estimating its tokens, "
            f"{cost.breakdown['MemoryStore.reserve (2 limits)']:.0f} µs the reservation, "
            f"{cost.breakdown['headers: dict of all headers + presented_key']:.0f} µs the "
            "headers and the key); the rest of the server's CPU per request is gRPC, and it "
            "grows with admission too (larger answers, metadata). Redis over memory: "
            "redis-py's reserve costs "
            f"{cost.breakdown['RedisStore.reserve (2 limits), one at a time: user CPU']:.0f} "
            "µs user + "
            f"{cost.breakdown['RedisStore.reserve (2 limits), one at a time: kernel CPU']:.0f}"
            " µs kernel CPU one at a time in this process; under load the server's kernel "
            f"time per request rose from {kernel['memory']:.0f} to {kernel['redis']:.0f} µs "
            f"(the loopback round trips; {len(memory_rows)} rounds each)."
        )
        busy = [r.server_busy for rows in cost.rounds for r in rows]
        spread = max(
            (max(r.server_us for r in cost.of(v)) - min(r.server_us for r in cost.of(v)))
            / percentile([r.server_us for r in cost.of(v)], 50)
            for v in VARIANTS
        )
        text = (
            f"- Noise: a configuration's server CPU per request moved by up to {spread:.0%} "
            "of its median between rounds on this shared machine (ranges in the table), so "
            "differences of a few hundred µs between (b), (c) and (d) in one run are not all "
            "signal; the in-process pieces are timed alone, but move between runs too (here "
            "the stage with the never-blocking gate differs from (b)'s by "
            f"{cost.breakdown['stage:gate'] - cost.breakdown['stage:memory']:+.0f} µs)."
        )
        if max(busy) < 0.95:
            text += (
                f" The server process was busy {min(busy):.2f}-{max(busy):.2f} of a core "
                "while driven: the client (same 2 cores) and other load on the machine, not "
                "the server alone, set the requests/s, so the CPU-per-request columns are the "
                "figures to compare; requests/s ratios are noisier."
            )
        out.append(text)
        down = {k: v for k, v in cost.store_down_lines.items() if v}
        if down:
            out.append(f"- The limiter store went down during the measured rounds: {down}.")
        if cost.stress is not None:
            stress = cost.stress
            reasons = _store_down_reasons(stress.store_down_lines)
            if stress.not_routed and reasons:
                out.append(
                    f"- **Redis store under a burst, default settings: {stress.not_routed} of "
                    f"{stress.requests} requests refused (503 rate_limiter_unavailable)** at "
                    f"{stress.streams} concurrent streams on one replica (fail_closed, timeout "
                    f"100 ms). The store was declared down {_times(sum(reasons.values()))}: "
                    f"{dict(reasons)}. "
                    + _why_down(reasons)
                    + "FailoverStore then treats Redis as down for at least its 1 s probe "
                    "interval, so every request in that second is refused (fail_closed) or "
                    "counted only locally at limit / replicas (the default `local`), although "
                    "redis-server itself was healthy throughout."
                )
            elif stress.not_routed:
                out.append(
                    f"- **Redis store under a burst, default settings: {stress.not_routed} of "
                    f"{stress.requests} requests refused (503 rate_limiter_unavailable)** at "
                    f"{stress.streams} concurrent streams on one replica (fail_closed, timeout "
                    "100 ms), each one whose own Redis call failed (timed out, or found no free "
                    "pooled connection; the probe does not tell which). The store was never "
                    "declared down: other calls got Redis's answers meanwhile (rule "
                    '"answered meanwhile" in `limiter/failover.py`), so the rest of the burst '
                    "kept counting in Redis. Runs of this probe before that rule (commits "
                    "99d5405, a0e8376) refused 800-890 of 3000: timeouts connecting, three in "
                    "a row, sent the replica to its fallback for the 1 s probe interval."
                )
            else:
                out.append(
                    f"- Redis store under a burst ({stress.streams} streams, default "
                    "settings): every request routed."
                )
    micro = results.micro
    e2e = results.e2e[0] if results.e2e else None
    if micro is not None:
        parse = percentile([r.us_per_body_message for r in micro.rows("parsing")], 50)
        transport = percentile([r.us_per_body_message for r in micro.rows("transport")], 50)
        parse_range = _range([r.us_per_body_message for r in micro.rows("parsing")])
        own = micro.breakdown.get(
            "UsageStream.on_message (parser, metadata read once, reconcile spawned)", 0.0
        )
        out.append(
            f"- **Usage observer: {parse:.0f} µs of ext_proc CPU per streamed chunk** "
            f"(median of rounds, range {parse_range}), against {transport:.0f} µs for the same "
            "messages without a reservation "
            "(the observer then skips the body: what remains is grpc.aio receiving a "
            "message). Most of the cost is therefore gRPC, not the observer: in-process, "
            f"the observer's own work is {own:.0f} µs per message (the SSE parser alone "
            f"{micro.breakdown.get('SseUsageParser.feed alone', 0):.0f} µs) and decoding the "
            "message with its metadata "
            f"{micro.breakdown.get('ProcessingRequest.FromString (chunk + metadata)', 0):.0f}"
            f" µs more; the gap between the two gRPC rows ({parse - transport:.0f} µs) is larger "
            "than that and moves between rounds. At one chunk per token, one ext_proc core "
            f"observes at most about {1e6 / parse:,.0f} tokens/s across all streams."
        )
    if e2e is not None:
        ratios = {k: percentile(v, 50) for k, v in e2e.round_ratios.items()}
        on, off = e2e.cpu_s["on"], e2e.cpu_s["off"]
        n_on, n_off = max(1, len(e2e.samples["on"])), max(1, len(e2e.samples["off"]))
        ttft = e2e.round_ratios["ttft_p50"]
        gap_ok = ratios["gap_p50"] < 1.05
        ttft_s = {v: percentile([x.ttft_s for x in e2e.samples[v]], 50) for v in OBS_VARIANTS}
        per_round = "; ".join(
            f"{k} {', '.join(f'{v:.2f}' for v in vs)}" for k, vs in e2e.round_ratios.items()
        )
        text = (
            f"- **End to end, {'the stream itself is not slowed' if gap_ok else 'chunks slow'}"
            f"**: with the observer on, the median gap between chunks is "
            f"{_x(ratios['gap_p50'])} (p99 {_x(ratios['gap_p99'])}) and the median total "
            f"{_x(ratios['total_p50'])} of the observer-off figures "
            f"({len(e2e.samples['on'])} / {len(e2e.samples['off'])} streams of {OBS_TOKENS} "
            f"tokens at {OBS_ITL_MS} ms; per-round on/off ratios: {per_round})."
        )
        if ratios["ttft_p50"] > 1.1 and min(ttft) > 1.0:
            text += (
                f" **TTFT is not free: {_ms(ttft_s['on'])} ms against {_ms(ttft_s['off'])} ms "
                f"at p50 ({_x(ratios['ttft_p50'])}; every round above 1).**"
            )
            if micro is not None and micro.routing_idle and micro.routing_observing:
                idle50 = percentile(micro.routing_idle, 50)
                busy50 = percentile(micro.routing_observing, 50)
                text += (
                    " Head-of-line blocking in the ext_proc event loop accounts for about "
                    f"{_ms(busy50 - idle50, 1)} ms of the {_ms(ttft_s['on'] - ttft_s['off'])} "
                    "ms: on the server alone (part 2a) a routing request took "
                    f"{_ms(idle50, 2)} ms (p50) / {_ms(percentile(micro.routing_idle, 99), 2)}"
                    f" ms (p99) idle and {_ms(busy50, 2)} / "
                    f"{_ms(percentile(micro.routing_observing, 99), 2)} ms while observing "
                    f"{percentile(micro.beside_chunks_per_s, 50):.0f} chunks/s."
                )
            text += (
                " The rest is most likely CPU contention: the observer adds CPU to ext_proc "
                "and to Envoy's one worker (below) on 2 cores that other work also used, and "
                "every hop of a new request then waits longer for a core."
            )
            others = results.e2e[1:] if results.e2e else []
            for level in others:
                level_ratios = level.round_ratios["ttft_p50"]
                text += (
                    f" With {level.clients} clients the TTFT ratio was "
                    f"{_x(percentile(level_ratios, 50))} (rounds: "
                    f"{', '.join(f'{v:.2f}' for v in level_ratios)})."
                )
        else:
            text += f" Median TTFT: {_x(ratios['ttft_p50'])}, within this machine's noise."
        text += (
            " The cost is CPU: the `up` process (ext_proc) spent "
            f"{on.get('up', 0) / n_on * 1e3:.1f} ms per stream with the observer against "
            f"{off.get('up', 0) / n_off * 1e3:.1f} ms without "
            f"({(on.get('up', 0) / n_on - off.get('up', 0) / n_off) * 1e6 / (OBS_TOKENS + 3):.0f}"
            f" µs per body message), Envoy {on.get('envoy', 0) / n_on * 1e3:.1f} against "
            f"{off.get('envoy', 0) / n_off * 1e3:.1f} ms."
        )
        out.append(text)
    window = results.window
    if window is not None:
        worst, _ = window.worst_window(window.per_s)
        worst_slack, _ = window.worst_window(window.per_s - SLACK_S)
        per = window.per_s
        minute = "the real 1-minute window" if per == 60 else f"{per:g} s windows (not 1 min)"
        store_worst = window.worst_store_window(per)
        verdict = "within" if store_worst <= window.bound else "ABOVE"
        slack_verdict = "within" if worst_slack <= window.bound else "above"
        out.append(
            f"- **Over-admission at {minute}: the limiter's own log shows at most "
            f"{store_worst} tokens in any {per:g} s of decision time ({verdict} the bound "
            f"{window.bound} = limit + one estimate).** By the clients' send times: "
            f"{worst_slack} tokens in the worst {per - SLACK_S:g} s window ({slack_verdict} "
            f"the bound), {worst} in the worst full {per:g} s window."
            + (
                f" The full-window figure by send time counts the edge of the next window: "
                f"a charge leaves the log {per:g} s after its decision, and requests sent "
                "just before that moment were decided just after it (a send-to-decision "
                "delay of milliseconds to a few hundred on this loaded machine), so by send "
                "time they fall into the earlier window."
                if worst > window.bound
                else ""
            )
            + (
                " Fixed windows by send time can exceed the limit for the same reason, and "
                "because real usage (reconciled) is a little below the estimate, which frees "
                "room for a few more requests."
                if any(t > WINDOW_LIMIT for t, _ in window.fixed_windows())
                else ""
            )
        )
        statuses = Counter(o.status for o in window.outcomes)
        unavailable = sum(1 for o in window.outcomes if o.code == "rate_limiter_unavailable")
        if unavailable:
            reasons = _store_down_reasons(window.store_lines)
            downs = sum(reasons.values())
            if downs:
                why = (
                    f"a replica declared the store down {_times(downs)} ({dict(reasons)}) and, "
                    "set to fail_closed, refused everything until its probe (every 1 s) found "
                    "Redis again. " + _why_down(reasons).rstrip()
                )
            else:
                why = (
                    "single Redis calls that missed the store timeout (or found no free pooled "
                    "connection) on the busy replicas; each such request is decided by the "
                    "fallback (fail_closed: refused), but no replica declared the store down "
                    "(that takes 3 failed calls in a row)."
                )
            out.append(
                f"- **{unavailable} requests ({unavailable / len(window.outcomes):.2%}) got "
                f"503 rate_limiter_unavailable although redis-server was up**: {why}"
            )
        out.append(
            f"- {statuses.get(200, 0)} admitted and {statuses.get(429, 0)} refused in "
            f"{window.duration_s:.0f} s: {window.clients} clients pausing "
            f"{REFUSED_PAUSE_S * 1e3:.0f} ms after a refusal keep 4 replicas and Redis busy "
            f"with refusals, answered in {_ms(percentile(window.latencies(429), 50), 1)} ms "
            f"(p50) / {_ms(percentile(window.latencies(429), 99), 1)} ms (p99)."
        )
    prio = results.priority
    if prio is not None and "gated" in prio.phases:
        gated, open_ = prio.phases["gated"], prio.phases.get("open")
        fifo = prio.phases.get("fifo")

        def p50(phase: Any, cls: str) -> float:
            return percentile([o.done - o.sent for o in phase.of(cls) if o.status == 200], 50)

        def ok(phase: Any, cls: str) -> int:
            return sum(1 for o in phase.of(cls) if o.status == 200)

        text = (
            f"- **Priority under overload**: behind the gate the provider never had more than "
            f"{gated.provider_max_in_flight} requests in flight; interactive requests were "
            f"all admitted ({ok(gated, 'interactive')}, p50 {_ms(p50(gated, 'interactive'), 0)}"
            f" ms against the provider's {PRIO_TTFT_MS} ms) while batch got "
            f"{ok(gated, 'batch')} of {len(gated.of('batch'))} through and was shed with 503 + "
            "Retry-After otherwise (strict priority: 8 interactive clients alone keep a "
            "4-slot gate full)."
        )
        if open_ is not None:
            text += (
                f" Without the gate the provider had {open_.provider_max_in_flight} in flight "
                f"at once and every class got p50 {_ms(p50(open_, 'interactive'), 0)} ms: the "
                "mock's latency does not grow with load, so this baseline is the best case a "
                "real provider would not give; what the gate buys is the bound on the "
                "provider and who waits."
            )
        if fifo is not None:
            text += (
                f" Envoy's own limit (4 connections, FIFO) also bounds the provider "
                f"({fifo.provider_max_in_flight} in flight) but makes interactive wait behind "
                f"batch: interactive p50 {_ms(p50(fifo, 'interactive'), 0)} ms "
                f"({ok(fifo, 'interactive')} admitted) against "
                f"{_ms(p50(gated, 'interactive'), 0)} ms ({ok(gated, 'interactive')}) with "
                "the priority gate."
            )
        text += (
            " Queue-time quantiles from `/metrics` are interpolated in the histogram's "
            "buckets (1-2.5 s wide for batch), so the client-side wait is the finer figure."
        )
        out.append(text)
    return out


def report(command: str, results: Results, envoy: str) -> str:
    parts_s = ", ".join(f"{k} {v:.0f} s" for k, v in (results.part_s or {}).items())
    lines = [
        f"`{command}` — {today()}; {machine()} (a shared machine: other work ran on the same "
        f"2 cores; load average (1 min) {results.loads[0]:.1f} at the start, "
        f"{results.loads[1]:.1f} at the end); {envoy} (`--envoy-concurrency 1`); {_git()}; "
        f"whole run {results.elapsed_s:.0f} s ({parts_s}). Generated by "
        "`benchmarks/admission.py` (the reading too, from the figures).",
        "",
    ]
    if results.cost is not None:
        cost = results.cost
        stress = cost.stress
        lines += [
            "### Cost of admission on the request path",
            "",
            "The real `ExtProcServer` in its own process per configuration (uvloop), built "
            "from a YAML document as `sluicegate ext-proc` builds it; this process drives "
            f"it over gRPC as Envoy does: {cost.streams} concurrent Process streams, each the "
            f"request headers ({cost.header_count} headers, those the OpenAI Python SDK "
            "sends, `authorization: Bearer <key>` included) then the buffered body "
            f"({cost.body_bytes} bytes, max_tokens 256), reading each answer, then waiting "
            "for the server to end the stream. Every answer is checked (headers answer, then "
            f"the routed body answer). {len(cost.rounds)} rounds x "
            f"{cost.requests_per_round} requests per configuration, the order rotated per "
            "round; req/s and CPU: median over rounds; *x (a)* and *added*: per-round "
            "against (a) of the same round, median. CPU from /proc (10 ms ticks). Limits "
            "never refuse (10^9 requests, 10^12 tokens per minute); Redis store "
            "`on_failure: fail_closed`, `timeout: 1s` (see the stress line below for the "
            "default 100 ms).",
            "",
            *cost_tables(cost),
            "",
        ]
        if stress is not None:
            lines += [
                f"Stress probe: (c) with the default store settings (`timeout: 100ms`, "
                f"fail_closed), {stress.streams} concurrent streams (as many as sluicegate's "
                f"blocking pool of 256 Redis connections), {stress.requests} requests after a "
                f"warm-up at {cost.streams}: **{stress.not_routed} answers not routed** "
                f"(503 rate_limiter_unavailable); store-down log lines: "
                f"{len(stress.store_down_lines)}"
                + (f", e.g. `{stress.store_down_lines[0]}`" if stress.store_down_lines else "")
                + ".",
                "",
            ]
    if results.micro is not None:
        micro = results.micro
        lines += [
            "### Usage observer: CPU per streamed chunk",
            "",
            "The usage stage of the same server (memory store), driven over gRPC as Envoy's "
            "observability mode does (no answers awaited): per stream the response headers "
            f"then {micro.tokens} token chunks ({micro.chunk_bytes} bytes each, the mock "
            "provider's own encoding with `include_usage`), the finish chunk, the usage "
            f"chunk ({micro.usage_chunk_bytes} bytes) and `[DONE]`, each message carrying the "
            "`sluicegate` metadata Envoy forwards (reservation, tenant, model, estimates, "
            f"x-ratelimit values). {micro.concurrency} streams at once; "
            f"{len(micro.rounds)} rounds, order alternated; median of rounds. The "
            "reservation ids are not in the store, so each stream's reconcile is a miss "
            "(one per stream, not per chunk).",
            "",
            *micro_table(micro),
            "",
        ]
    if results.e2e:
        e2e = results.e2e[0]
        lines += [
            "### Usage observer end to end: a streamed response, observer on vs off",
            "",
            "Two `sluicegate up` stacks side by side (each: control plane + ext_proc, one "
            f"Envoy worker, a mock provider: TTFT {OBS_TTFT_MS} ms, {OBS_TOKENS} tokens, ITL "
            f"{OBS_ITL_MS} ms); the only difference is the tenant's limits: tokens + requests "
            "puts the usage observer in Envoy's filter chain, requests only leaves it out. "
            + " and ".join(f"{level.clients}" for level in results.e2e)
            + " closed-loop aiohttp clients streaming chat completions "
            f"(`stream_options.include_usage`), {e2e.rounds} rounds per level of "
            + " and ".join(f"{level.round_s:g} s" for level in results.e2e)
            + " per stack, the order alternated. TTFT: send to the first `data:` line; gaps: "
            "between consecutive token chunks as the client reads them; total: send to the "
            "end of the body. CPU from /proc over the rounds.",
            "",
            *e2e_table(results.e2e),
            "",
        ]
    if results.window is not None:
        window = results.window
        per_note = (
            "the real window: `per: 1m`"
            if window.per_s == 60
            else f"`per: {window.per_s:g}s` (NOT the minute: run with the default for it)"
        )
        lines += [
            "### Over-admission at the real window",
            "",
            f"One tenant limited to {WINDOW_LIMIT:,} tokens, {per_note}; "
            f"{window.clients} concurrent closed-loop clients for {window.duration_s:.0f} s "
            f"({window.duration_s / window.per_s:.0f} windows); {window.replicas} ext_proc "
            "processes (`up`'s own + `sluicegate.ext_proc_replicas`) sharing a real "
            "redis-server (`replicas: 4`, `fail_closed`); the mock provider answers every "
            f"request with all of max_tokens ({WINDOW_MAX_TOKENS}), so real usage is close "
            "to the estimate (reconcile replaces the reservation with it). A refused client "
            f"waits {REFUSED_PAUSE_S * 1e3:.0f} ms. Tokens admitted = the real usage of each "
            "200, placed at its send time.",
            "",
            *window_tables(window),
            "",
        ]
    if results.priority is not None:
        prio = results.priority
        phase_s = next(iter(prio.phases.values())).seconds if prio.phases else 0
        classes = ", ".join(
            f"{c['name']} max_queue {c['max_queue']} max_wait {c['max_wait']}" for c in PRIO_CLASSES
        )
        lines += [
            "### Priority under overload",
            "",
            f"One `sluicegate up`, one mock provider (TTFT {PRIO_TTFT_MS} ms, 16 tokens, "
            "non-streamed, so a request holds the provider about 0.2 s). Three routes to "
            "it, one phase each: "
            + "; ".join(f"*{k}*: {v}" for k, v in PRIO_LABELS.items())
            + f". Classes: {classes}. Tenant `ui` is interactive, `jobs` batch. "
            + ", ".join(f"{n} {c}" for c, n in prio.clients.items())
            + f" closed-loop clients for {phase_s:g} s per phase; a 503 client waits its "
            "Retry-After (1 s without one). *queue time*: `sluicegate_queue_time_seconds` "
            "(outcome admitted) from `/metrics` before and after the phase, interpolated in "
            "its buckets (…0.1, 0.25, 0.5, 1, 2.5, 5 s) like `histogram_quantile`; "
            "*client-side wait*: end-to-end time minus the provider's own "
            "`openai-processing-ms` (includes Envoy and ext_proc time).",
            "",
            *priority_table(prio),
            "",
        ]
    lines += ["### Reading", "", *reading(results)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, write_help="update RESULTS.md (all parts)")
    parser.add_argument(
        "--part",
        action="append",
        choices=PARTS,
        help="run only this part (repeatable); default: all",
    )
    parser.add_argument("--rounds", type=int, default=3, help="part 1 rounds")
    parser.add_argument("--requests", type=int, default=1500, help="part 1 requests/round")
    parser.add_argument("--streams", type=int, default=64, help="part 1 concurrent streams")
    parser.add_argument("--observer-round-s", type=float, default=4.0)
    parser.add_argument(
        "--window-per",
        type=float,
        default=60.0,
        help="part 3 window in seconds (default 60: the real minute)",
    )
    parser.add_argument("--priority-s", type=float, default=15.0, help="part 4 phase length")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    parts = tuple(args.part or PARTS)
    if args.write and set(parts) != set(PARTS):
        parser.error("--write records the whole section: run every part")
    command = command_line("benchmarks.admission", argv)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="admission-bench-"))
    try:
        results = run(parts, args, work)
    finally:
        if args.keep_logs:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    results.elapsed_s = time.monotonic() - started
    results.loads = (load_before, os.getloadavg()[0])
    text = report(command, results, _envoy_version())
    print("\n" + text)
    leftover = running_children()
    print(f"\ntotal {results.elapsed_s:.0f} s; children still running: {leftover or 'none'}")
    if args.write:
        update_section(SECTION, text)
        print("updated benchmarks/RESULTS.md")
    return 1 if leftover else 0


if __name__ == "__main__":
    sys.exit(main())
