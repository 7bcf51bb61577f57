"""The tables of the `## Gateways compared` section: one function a table, each from
the rounds (medians across rounds of figures and of within-round differences)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from .peer_round import PeerRound, stream_verdict
from .plan import P99_LIMITS_MS, Plan
from .step import Step
from .summary import DIRECT, Rounds, frontier, median, peak_rss, ramp_step, sweep_step

MIB = 1024 * 1024
DASH = "—"


def ms(value: float | None, signed: bool = False) -> str:
    if value is None:
        return DASH
    return f"{value * 1000:+.2f}" if signed else f"{value * 1000:.2f}"


def number(value: float | None, digits: int = 0) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def mib(value: float | None) -> str:
    return DASH if value is None else f"{value / MIB:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    align = ["---"] * left + ["---:"] * (len(header) - left)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _per_round(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    return ", ".join(fmt(v) for v in values) or DASH


def latency_table(rounds: Rounds, names: Sequence[str]) -> str:
    rows = []
    for name in names:
        p50 = rounds.median(name, lambda r: r.latency.e2e_p50 if r.latency else None)
        p99 = rounds.median(name, lambda r: r.latency.e2e_p99 if r.latency else None)
        added50 = rounds.added(name, lambda r: r.latency.e2e_p50 if r.latency else None)
        added99 = rounds.added(name, lambda r: r.latency.e2e_p99 if r.latency else None)
        gateway = name != DIRECT
        rows.append([
            name, ms(p50), ms(p99),
            ms(median(added50), True) if gateway else DASH,
            ms(median(added99), True) if gateway else DASH,
            _per_round(added50, lambda v: ms(v, True)) if gateway else DASH,
        ])  # fmt: skip
    return _table(["peer", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms",
                   "added p50 per round"], rows)  # fmt: skip


def _frontier(limit_s: float, result: PeerRound) -> float:
    return frontier(result, limit_s)


def frontier_table(rounds: Rounds, names: Sequence[str]) -> str:
    rows = []
    for name in names:
        row = [name, number(rounds.median(name, lambda r: frontier(r, None)))]
        for limit in P99_LIMITS_MS:
            value = rounds.median(name, partial(_frontier, limit / 1000))
            row.append(number(value) if value else "none")
        rows.append(row)
    limits = [f"p99 ≤ {limit:g} ms" for limit in P99_LIMITS_MS]
    return _table(["peer", "most req/s, no failure", *limits], rows)


def sweep_table(rounds: Rounds, names: Sequence[str], plan: Plan, title: str,
                figure: Callable[[Step], float | None], fmt: Callable[[float | None], str],
                total: bool = False) -> str:  # fmt: skip
    """One figure of every sweep step: a row a peer, a column a concurrency (median of
    rounds, or with `total` the sum over rounds)."""
    rows = []
    for name in names:
        row = [name]
        for concurrency in plan.sweep:
            values = [
                figure(step) for r in rounds.of(name)
                if (step := sweep_step(r, concurrency)) is not None
            ]  # fmt: skip
            kept = [v for v in values if v is not None]
            row.append(fmt(sum(kept) if total and kept else median(kept)))
        rows.append(row)
    return _table([title, *[f"c={c}" for c in plan.sweep]], rows)


def cpu_table(rounds: Rounds, names: Sequence[str], plan: Plan) -> str:
    c = plan.cpu_concurrency

    def at(figure: Callable[[Step], float | None]) -> Callable[[PeerRound], float | None]:
        return lambda r: figure(s) if (s := sweep_step(r, c)) is not None else None

    rows = []
    for name in names:
        peer = rounds.median(name, at(lambda s: s.peer_cpu_us))
        per_cpu_s = 1e6 / peer if peer else None
        rows.append([
            name, number(peer), number(per_cpu_s),
            number(rounds.median(name, at(lambda s: s.peer_cores)), 2) if peer else DASH,
            number(rounds.median(name, at(lambda s: s.upstream_cpu_us))),
            number(rounds.median(name, at(lambda s: s.generator_cpu_us))),
            number(rounds.median(name, at(lambda s: s.generator_cores)), 2),
        ])  # fmt: skip
    return _table(["peer", "peer µs/req", "req per CPU-s", "peer cores", "upstream µs/req",
                   "generator µs/req", "generator cores"], rows)  # fmt: skip


def streams_table(rounds: Rounds, names: Sequence[str], plan: Plan) -> str:
    def of(figure: Callable[[Step], float | None]) -> Callable[[PeerRound], float | None]:
        return lambda r: figure(r.stream) if r.stream is not None else None

    c = plan.stream_cpu_concurrency
    rows = []
    for name in names:
        gateway = name != DIRECT
        sustained = [float(r.streams_sustained or 0) for r in rounds.of(name)]
        row = [name, ms(rounds.median(name, of(lambda s: s.ttft_p50))),
               ms(rounds.median(name, of(lambda s: s.ttft_p99)))]  # fmt: skip
        for figure in (lambda s: s.ttft_p50, lambda s: s.ttft_p99):
            row.append(ms(median(rounds.added(name, of(figure))), True) if gateway else DASH)
        row += [ms(rounds.median(name, of(lambda s: s.itl_p50))),
                ms(rounds.median(name, of(lambda s: s.itl_p99)))]  # fmt: skip
        for figure in (lambda s: s.itl_p50, lambda s: s.itl_p99):
            row.append(ms(median(rounds.added(name, of(figure))), True) if gateway else DASH)
        cpu = rounds.median(name, lambda r: s.peer_cpu_us if (s := ramp_step(r, c)) else None)
        row += [number(median(sustained)), _per_round(sustained, lambda v: f"{v:.0f}"),
                number(cpu)]  # fmt: skip
        rows.append(row)
    return _table(["peer", "TTFT p50 ms", "TTFT p99 ms", "added TTFT p50", "added TTFT p99",
                   "ITL p50 ms", "ITL p99 ms", "added ITL p50", "added ITL p99",
                   "streams sustained", "per round", f"µs/stream (c={c})"], rows)  # fmt: skip


def ramp_table(rounds: Rounds, names: Sequence[str], plan: Plan) -> str:
    """Every ramp step: the median largest gap (ms) and in how many rounds it failed."""
    rows = []
    for name in names:
        row = [name]
        for concurrency in plan.stream_ramp:
            steps = [s for r in rounds.of(name) if (s := ramp_step(r, concurrency))]
            if not steps:
                row.append(DASH)
                continue
            gap = median(s.itl_max for s in steps)
            bad = sum(1 for s in steps if stream_verdict(s, plan.stall_s) is not None)
            row.append((DASH if gap is None else f"{gap * 1000:.0f}") + (f" ✗{bad}" if bad else ""))
        rows.append(row)
    return _table(["largest gap ms", *[f"c={c}" for c in plan.stream_ramp]], rows)


def memory_table(rounds: Rounds, names: Sequence[str], plan: Plan) -> str:
    c = plan.memory_concurrency
    rows = []
    for name in [n for n in names if n != DIRECT]:
        load = rounds.median(
            name, lambda r: s.peer_rss if (s := sweep_step(r, c)) and s.peer_rss else None
        )
        rows.append([
            name, number(rounds.median(name, lambda r: float(r.processes) or None)),
            mib(rounds.median(name, lambda r: r.idle_rss)), mib(load),
            mib(rounds.median(name, peak_rss)),
            mib(rounds.median(name, lambda r: r.after_rss)),
        ])  # fmt: skip
    return _table(["peer", "processes", "idle MiB", f"under load (c={c}) MiB", "peak MiB",
                   "after MiB"], rows)  # fmt: skip
