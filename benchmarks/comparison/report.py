"""The `## Gateways compared` section of benchmarks/RESULTS.md: how the run was made,
what was compared, the tables (tables.py) and the reading of them (reading.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import tables
from .plan import (
    ANSWER_TOKENS,
    CHUNK_INTERVAL_MS,
    INPUT_TOKENS,
    STALL_INTERVALS,
    Plan,
)
from .reading import reading
from .step import Step
from .summary import DIRECT, Rounds

HEADING = "Gateways compared"


@dataclass
class RunInfo:
    command: str
    date: str
    machine: str
    loads: list[float]  # 1-minute load average at the start, at each later round's, at the end
    duration_s: float
    plan: Plan
    upstream: str  # its command line, port left out
    versions: dict[str, str]
    does: dict[str, str]
    commit: str | None = None  # the tree measured: git's HEAD, and whether sluicegate/ differed


def _method(rounds: Rounds, info: RunInfo) -> list[str]:
    plan = info.plan
    stall_ms = STALL_INTERVALS * CHUNK_INTERVAL_MS
    return [
        f"`{info.command}` — {info.date}"
        + (f", sluicegate at {info.commit}" if info.commit else "")
        + f"; {info.machine}; load average (1 min) at the "
        f"start, at each later round's start and at the end: "
        f"{', '.join(f'{load:.2f}' for load in info.loads)}; whole run "
        f"{info.duration_s / 60:.1f} min.",
        "Every gateway in front of one upstream, the fixed-answer server of `sluicegate "
        f"bench` (`{info.upstream}`: a {ANSWER_TOKENS}-token answer at once as JSON, or "
        f"as {ANSWER_TOKENS} content events {CHUNK_INTERVAL_MS:g} ms apart when streamed), "
        "driven by `sluicegate bench`'s engine through its Python API (one process, closed "
        f"loop; a {INPUT_TOKENS.removeprefix('fixed:')}-token prompt, `max_tokens` "
        f"{ANSWER_TOKENS}; streams without a usage event asked, so each content event is "
        "counted). Everything shares the machine's 2 cores.",
        f"{rounds.count} round(s); the peers' order rotates each round; each peer is started "
        "once per round (LiteLLM with 2 workers takes about 40 s to start, so starting it "
        "for every measurement would double the run), then measured in this order: idle "
        f"RSS; non-streamed at concurrency 1 ({plan.latency.warmup_s:g} s warm-up, "
        f"{plan.latency.duration_s:g} s measured); the non-streamed sweep at concurrency "
        f"{', '.join(map(str, plan.sweep))} ({plan.sweep_phase.warmup_s:g} + "
        f"{plan.sweep_phase.duration_s:g} s each); streams at concurrency "
        f"{plan.stream_concurrency} ({plan.stream_phase.warmup_s:g} + "
        f"{plan.stream_phase.duration_s:g} s); the stream ramp, concurrency "
        f"{', '.join(map(str, plan.stream_ramp))} ({plan.stream_ramp_phase.warmup_s:g} + "
        f"{plan.stream_ramp_phase.duration_s:g} s each) until a step loses a stream or a "
        f"content event, stalls (a gap over {stall_ms:g} ms, {STALL_INTERVALS:g} intervals) "
        "or saturates the generator; RSS once idle again. *Added* figures are the peer's "
        "minus direct's in the same round; ratios are within a round; the tables give "
        "the median over rounds.",
        "Requests/s: the requests sent in a step's measured window and answered, over "
        "the window's length (in a closed loop's steady state, the rate they are answered "
        "at; the bench's own figure also counts the drain after the window). "
        "CPU is each process tree's (all its processes, from /proc, 10 ms ticks) over the "
        "measured window, sampled at its start and end while the load runs, divided by "
        "the requests sent in it. RSS is the sum of VmRSS over the tree (pages shared "
        "between processes count once per process).",
    ]


def _peers(rounds: Rounds, names: Sequence[str], info: RunInfo) -> list[str]:
    does = [f"- **{n}**: {info.does[n]}" for n in names]
    versions = []
    for name in names:
        starts = ", ".join(f"{r.start_s:.1f}" for r in rounds.of(name) if r.start_s is not None)
        started = f"; started in {starts} s" if name != DIRECT and starts else ""
        versions.append(f"- **{name}**: {info.versions[name]}{started}")
    return [
        "### What each peer did per request\n\n" + "\n".join(does),
        "### Versions\n\n" + "\n".join(versions),
    ]


def _sweep(rounds: Rounds, names: Sequence[str], plan: Plan) -> str:
    def table(title: str, figure: Callable[[Step], float | None],
              fmt: Callable[[float | None], str], total: bool = False) -> str:  # fmt: skip
        return tables.sweep_table(rounds, names, plan, title, figure, fmt, total)

    def cores(value: float | None) -> str:
        return tables.number(value, 2)

    return "\n\n".join([
        table("req/s", lambda s: s.requests_per_s, tables.number),
        table("e2e p50 ms", lambda s: s.e2e_p50, tables.ms),
        table("e2e p99 ms", lambda s: s.e2e_p99, tables.ms),
        table("failed", lambda s: float(s.failed), tables.number, total=True),
        table("peer CPU µs/req", lambda s: s.peer_cpu_us, tables.number),
        table("generator cores", lambda s: s.generator_cores, cores),
        table("generator loop lag ms", lambda s: s.generator_lag, tables.ms),
    ])  # fmt: skip


def _streams(rounds: Rounds, names: Sequence[str], plan: Plan) -> str:
    stopped = [
        f"- {n}: " + "; ".join(f"round {r.round}: {r.streams_stop}" for r in rounds.of(n))
        for n in names
    ]
    return "\n\n".join([
        f"TTFT and inter-chunk latency (ITL) at concurrency {plan.stream_concurrency}; "
        "streams sustained: the ramp's last step with every stream whole and no stall.",
        tables.streams_table(rounds, names, plan),
        tables.ramp_table(rounds, names, plan),
        "Largest gap between two content events of a stream, ms (median over rounds). ✗N: "
        "the step lost a stream or a content event, or stalled, on two runs in a row (a "
        "step that fails is run once more), in N rounds. The ramp stopped at:\n\n"
        + "\n".join(stopped),
    ])  # fmt: skip


def section(rounds: Rounds, names: Sequence[str], litellms: Sequence[str], info: RunInfo) -> str:
    plan = info.plan
    failures = [
        f"- {r.name} (round {r.round}): {r.failure}"
        for peers in rounds.table.values() for r in peers.values() if r.failure
    ]  # fmt: skip
    parts = [
        *_method(rounds, info),
        *_peers(rounds, names, info),
        "### Added latency, non-streamed, concurrency 1\n\n" + tables.latency_table(rounds, names),
        "### The throughput frontier\n\nThe most requests/s of a sweep step with no failed "
        "request and its e2e p99 at or under the limit (median over rounds).\n\n"
        + tables.frontier_table(rounds, names),
        "### The sweep in full (non-streamed; medians over rounds, failures summed)\n\n"
        + _sweep(rounds, names, plan),
        f"### CPU per request (sweep step c={plan.cpu_concurrency})\n\n"
        + tables.cpu_table(rounds, names, plan),
        "### Streams\n\n" + _streams(rounds, names, plan),
        "### Memory (RSS of the whole tree)\n\n" + tables.memory_table(rounds, names, plan),
        "### Reading\n\n" + reading(rounds, names, litellms, plan),
    ]
    if failures:
        parts.append("### Not measured\n\n" + "\n".join(failures))
    return "\n\n".join(parts)
