"""The "Reading" of the `## Gateways compared` section: the upstream's and the load
generator's headroom, the streams sustained, the issue's aims for sluicegate with full
admission (each with its verdict), and where sluicegate loses to plain Envoy; every
sentence made from the run's figures."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial

from . import tables
from .peer_round import PeerRound, generator_busy
from .plan import GENERATOR_LAG_STALLS, GENERATOR_SATURATED, Plan
from .step import Step
from .summary import DIRECT, Rounds, frontier, median, sweep_step

ADMISSION = "sluicegate-admission"
ROUTING = "sluicegate-routing"
FAST_ROUTING = "sluicegate-fast-routing"
FAST_ADMISSION = "sluicegate-fast-admission"
AUTO_ADMISSION = "sluicegate-auto-admission"
# The peers issue 11's aims are read for: the exact lane (keys, token limits and the
# priority gate, in Python) and the fast and auto lanes (keys and token limits in Envoy).
ADMISSION_PEERS = (ADMISSION, FAST_ADMISSION, AUTO_ADMISSION)
# Issue 12's aims for routing without Python, against plain Envoy.
FAST_ADDED_P50_AIM_S = 0.0001
FAST_THROUGHPUT_AIM = 0.8
FAST_THROUGHPUT_CONCURRENCY = 32
ENVOY = "envoy"
PORTKEY = "portkey"


def _cpu_at(plan: Plan) -> Callable[[PeerRound], float | None]:
    return lambda r: s.peer_cpu_us if (s := sweep_step(r, plan.cpu_concurrency)) else None


def _added_p50(peers: dict[str, PeerRound], name: str) -> float | None:
    own, direct = peers[name].latency, peers[DIRECT].latency
    if own is None or direct is None or own.e2e_p50 is None or direct.e2e_p50 is None:
        return None
    return own.e2e_p50 - direct.e2e_p50


def _added_ratio(ours: str, other: str, peers: dict[str, PeerRound]) -> float | None:
    """`ours`'s added p50 over `other`'s, in one round."""
    mine, theirs = _added_p50(peers, ours), _added_p50(peers, other)
    return mine / theirs if mine is not None and theirs else None


def _added_over_envoy(name: str, peers: dict[str, PeerRound]) -> float | None:
    ours, envoy = _added_p50(peers, name), _added_p50(peers, ENVOY)
    return ours - envoy if ours is not None and envoy is not None else None


def _itl(figure: Callable[[Step], float | None]) -> Callable[[PeerRound], float | None]:
    return lambda r: figure(r.stream) if r.stream is not None else None


def _ratio_text(values: Sequence[float], digits: int = 2) -> str:
    middle = median(values)
    assert middle is not None, "only called with values"
    rounds = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{middle:.{digits}f}x (per round {rounds})"


def _aim(title: str, values: Sequence[float], aim: str, met: Callable[[float], bool],
         digits: int = 2) -> list[str]:  # fmt: skip
    """One bullet: the median of per-round `values` against its aim (none unmeasured)."""
    middle = median(values)
    if middle is None:
        return []
    verdict = "met" if met(middle) else "missed"
    return [f"- **{title}**: {_ratio_text(values, digits)}; aim {aim}: {verdict}."]


def _aims(rounds: Rounds, litellms: Sequence[str], plan: Plan) -> list[str]:
    """The issue's aims for sluicegate with admission, each with its verdict: for each of
    the admission peers measured (the exact lane with its priority gate; the fast and
    auto lanes, which have no gate: ADMISSION_PEERS)."""
    lines = []
    for name in ADMISSION_PEERS:
        if rounds.of(name):
            lines += _aims_of(rounds, name, litellms, plan)
    return lines


def _aims_of(rounds: Rounds, name: str, litellms: Sequence[str], plan: Plan) -> list[str]:
    cpu = _cpu_at(plan)
    lines = []
    for litellm in litellms:
        lines += _aim(
            f"Requests per CPU-second, {name} against {litellm} (c={plan.cpu_concurrency})",
            rounds.ratios(litellm, name, cpu),  # litellm's µs over sluicegate's
            "≥ 25x", lambda v: v >= 25, digits=1,
        )  # fmt: skip
        lines += _aim(
            f"Added p50 at concurrency 1, {name} over {litellm}'s",
            rounds.within([name, litellm, DIRECT], partial(_added_ratio, name, litellm)),
            "≤ 0.1x", lambda v: v <= 0.1,
        )  # fmt: skip
    lines += _aim(
        f"Most requests/s with no failure, {name} over {PORTKEY}",
        rounds.ratios(name, PORTKEY, lambda r: frontier(r, None)),
        "> 1x (while doing admission Portkey does not)", lambda v: v > 1,
    )  # fmt: skip
    for label, figure in (("p50", _itl(lambda s: s.itl_p50)),
                          ("mean", _itl(lambda s: s.itl_mean))):  # fmt: skip
        lines += _aim(
            f"Streamed inter-chunk latency {label}, {name} over plain Envoy's",
            rounds.ratios(name, ENVOY, figure), "within 2 %",
            lambda v: abs(v - 1) <= 0.02, digits=3,
        )  # fmt: skip
    return lines


def _fast_lane_aims(rounds: Rounds) -> list[str]:
    """Issue 12's aims for the fast lane, routing alone and with a tenant's keys and
    limits (docs/fast-lane.md): at most 0.1 ms p50 more than plain Envoy at concurrency
    1, at least 0.8x its requests/s at 32."""
    lines = []
    for name in (FAST_ROUTING, FAST_ADMISSION):
        if rounds.of(name) and rounds.of(ENVOY):
            lines += _fast_aims_of(rounds, name)
    return lines


def _fast_aims_of(rounds: Rounds, name: str) -> list[str]:
    lines = []
    added = rounds.within([name, ENVOY, DIRECT], partial(_added_over_envoy, name))
    middle = median(added)
    if middle is not None:
        verdict = "met" if middle <= FAST_ADDED_P50_AIM_S else "missed"
        per_round = ", ".join(f"{value * 1000:+.3f}" for value in added)
        lines.append(
            f"- **Added p50 at concurrency 1, {name} over plain Envoy**: "
            f"{middle * 1000:+.3f} ms (per round {per_round}); aim ≤ 0.1 ms: {verdict}."
        )
    at = FAST_THROUGHPUT_CONCURRENCY

    def rate(r: PeerRound) -> float | None:
        return s.requests_per_s if (s := sweep_step(r, at)) else None

    lines += _aim(
        f"Requests/s at concurrency {at}, {name} over plain Envoy",
        rounds.ratios(name, ENVOY, rate), f"≥ {FAST_THROUGHPUT_AIM}x",
        lambda v: v >= FAST_THROUGHPUT_AIM,
    )  # fmt: skip
    return lines


def _loses(rounds: Rounds, plan: Plan) -> list[str]:
    """sluicegate against plain Envoy with sluicegate's own routes: what ext_proc costs."""
    cpu = _cpu_at(plan)
    envoy_best = rounds.median(ENVOY, lambda r: frontier(r, None))

    def against_envoy(names: tuple[str, ...]) -> list[str]:
        found = []
        for name in names:
            if not rounds.of(name) or not rounds.of(ENVOY):
                continue
            added = median(rounds.within([name, ENVOY, DIRECT], partial(_added_over_envoy, name)))
            best = rounds.median(name, lambda r: frontier(r, None))
            cost = median(rounds.ratios(name, ENVOY, cpu))
            found.append(
                f"- **{name} against plain Envoy**: {tables.ms(added, True)} ms p50 more at "
                f"concurrency 1, {tables.number(best)} against {tables.number(envoy_best)} "
                f"requests/s at most, {tables.number(cost, 1)}x its CPU per request."
            )
        return found

    lines = against_envoy((ROUTING, ADMISSION))
    if lines:
        lines.append(
            "  That is where sluicegate loses: its routing is a Python ext_proc server that "
            "Envoy calls on every request (headers, then the buffered body: two gRPC round "
            "trips to grpc.aio), whose floor alone is most of this (RESULTS.md, 'The ext_proc "
            "floor'). Issue 12 is the fix."
        )
    fast = against_envoy((FAST_ROUTING, FAST_ADMISSION))
    if fast:
        fast.append(
            "  The fast lane calls no Python per request; what it adds is Envoy's own work: "
            "the Lua model reader, the usage readers, the fault and error-body filters and "
            "the record log, each tens of microseconds here (RESULTS.md, 'Where the time "
            "goes: Envoy alone, arm by arm')."
        )
    return lines + fast


def _against_portkey(rounds: Rounds, plan: Plan) -> list[str]:
    """sluicegate with full admission against Portkey, the other light gateway: where it
    carries more and where it costs more."""
    if not rounds.of(ADMISSION) or not rounds.of(PORTKEY) or not rounds.of(DIRECT):
        return []

    def at_cpu(figure: Callable[[Step], float | None]) -> Callable[[PeerRound], float | None]:
        return lambda r: figure(s) if (s := sweep_step(r, plan.cpu_concurrency)) else None

    def both(figure: Callable[[PeerRound], float | None]) -> tuple[float | None, float | None]:
        return rounds.median(ADMISSION, figure), rounds.median(PORTKEY, figure)

    added = (
        median(rounds.added(ADMISSION, lambda r: r.latency.e2e_p50 if r.latency else None)),
        median(rounds.added(PORTKEY, lambda r: r.latency.e2e_p50 if r.latency else None)),
    )
    cpu = both(at_cpu(lambda s: s.peer_cpu_us))
    cores = both(at_cpu(lambda s: s.peer_cores))
    ttft = (
        median(rounds.added(ADMISSION, _itl(lambda s: s.ttft_p50))),
        median(rounds.added(PORTKEY, _itl(lambda s: s.ttft_p50))),
    )
    idle = both(lambda r: r.idle_rss)
    loses = [what for what, (ours, theirs) in (
        ("latency at concurrency 1", added), ("CPU per request", cpu),
        ("a stream's TTFT", ttft), ("idle memory", idle),
    ) if ours is not None and theirs is not None and ours > theirs]  # fmt: skip
    return [
        f"- **{ADMISSION} against {PORTKEY}**: adds {tables.ms(added[0])} ms p50 at "
        f"concurrency 1 (Portkey {tables.ms(added[1])}); {tables.number(cpu[0])} µs of CPU "
        f"per request (Portkey {tables.number(cpu[1])}), on {tables.number(cores[0], 2)} "
        f"cores at c={plan.cpu_concurrency}: Envoy and the ext_proc server are two "
        f"processes, Portkey one Node thread ({tables.number(cores[1], 2)}); adds "
        f"{tables.ms(ttft[0])} ms to a stream's TTFT (Portkey {tables.ms(ttft[1])}); idles "
        f"at {tables.mib(idle[0])} MiB (Portkey {tables.mib(idle[1])}). It loses on: "
        f"{', '.join(loses) or 'none of these'}."
    ]


def _memory(rounds: Rounds, names: Sequence[str]) -> list[str]:
    idle = [f"{n} {tables.mib(rounds.median(n, lambda r: r.idle_rss))}" for n in names
            if n != DIRECT and rounds.of(n)]  # fmt: skip
    if not idle:
        return []
    return [
        f"- **Memory, idle (MiB)**: {'; '.join(idle)}. sluicegate's tree is four Python "
        "and C++ processes (`sluicegate up`, the control plane, the ext_proc server, "
        "Envoy), each counted whole; LiteLLM with 2 workers is four Python processes "
        "(the server, 2 workers, multiprocessing's resource tracker)."
    ]


def _generator(rounds: Rounds, names: Sequence[str], plan: Plan) -> list[str]:
    direct_best = rounds.median(DIRECT, lambda r: frontier(r, None))
    gateways = [n for n in names if n != DIRECT]
    fastest = max(gateways, key=lambda n: rounds.median(n, lambda r: frontier(r, None)) or 0)
    fastest_best = rounds.median(fastest, lambda r: frontier(r, None))
    upstream_us = rounds.median(
        DIRECT, lambda r: s.upstream_cpu_us if (s := sweep_step(r, plan.cpu_concurrency)) else None
    )
    ceiling = 1e6 / upstream_us if upstream_us else None
    busy = Counter(
        f"{n} c={s.concurrency}" for n in gateways for r in rounds.of(n)
        for s in r.sweep if generator_busy(s, plan) is not None
    )  # fmt: skip
    steps = ", ".join(f"{step} ({count} of {rounds.count} rounds)" for step, count in
                      sorted(busy.items()))  # fmt: skip
    ratio = f"{ceiling / fastest_best:.1f}x" if ceiling and fastest_best else "?"
    return [
        f"- **The upstream is not the bottleneck**: it spends {tables.number(upstream_us)} µs "
        f"of CPU per answer (direct, c={plan.cpu_concurrency}), about "
        f"{tables.number(ceiling)} answers/s on one core, {ratio} the fastest gateway's "
        f"{tables.number(fastest_best)} requests/s ({fastest}).",
        f"- **The load generator's ceiling** (one `sluicegate bench` process, direct to the "
        f"upstream on the same 2 cores): {tables.number(direct_best)} requests/s. Gateway "
        f"sweep steps where it used ≥ {GENERATOR_SATURATED:g} of a core or its loop ran a "
        f"timer ≥ {GENERATOR_LAG_STALLS * plan.stall_s * 1000:g} ms late: {steps or 'none'}.",
    ]


def _streams_reading(rounds: Rounds, names: Sequence[str]) -> list[str]:
    """The streams each peer sustained, and in how many rounds the generator (not the
    peer) ended its ramp."""
    parts = []
    for name in names:
        results = rounds.of(name)
        sustained = median(float(r.streams_sustained or 0) for r in results)
        by_generator = sum(1 for r in results if "load generator" in r.streams_stop)
        parts.append(
            f"{name} {tables.number(sustained)}"
            + (f" ({by_generator} of {len(results)} ramps ended with the load generator "
               "or the cores saturated)" if by_generator else "")
        )  # fmt: skip
    return [
        "- **Concurrent streams sustained** (whole, no gap over the stall limit; median "
        f"of rounds): {'; '.join(parts)}. direct's is the limit of the generator and the "
        "upstream on these cores; the ramp's stops are listed under Streams."
    ]


def reading(rounds: Rounds, names: Sequence[str], litellms: Sequence[str], plan: Plan) -> str:
    return "\n".join([
        *_generator(rounds, names, plan), *_streams_reading(rounds, names),
        *_aims(rounds, litellms, plan), *_fast_lane_aims(rounds), *_loses(rounds, plan),
        *_against_portkey(rounds, plan), *_memory(rounds, names),
    ])  # fmt: skip
