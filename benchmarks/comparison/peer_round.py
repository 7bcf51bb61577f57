"""Everything measured of one peer in one round, in this order, on one start of it:
its idle RSS; the non-streamed latency at concurrency 1; the concurrency sweep; the
paced stream; the stream ramp (up to the first step that loses a chunk or a stream,
stalls, or saturates the load generator); and, once it is idle again, its RSS after."""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.peers import Peer, RunningPeer, Upstream
from benchmarks.peers.processes import rss_bytes, wait_idle

from .plan import ANSWER_TOKENS, GENERATOR_LAG_STALLS, GENERATOR_SATURATED, Plan
from .step import Step, run_step


@dataclass
class PeerRound:
    name: str
    round: int
    position: int  # its place in the round's (rotated) order
    start_s: float | None = None
    processes: int = 0
    idle_rss: int | None = None
    after_rss: int | None = None
    latency: Step | None = None
    sweep: list[Step] = field(default_factory=list)
    stream: Step | None = None
    stream_ramp: list[Step] = field(default_factory=list)
    streams_sustained: int | None = None  # None: not even the ramp's first step
    streams_stop: str = ""  # why the ramp stopped
    stream_retried: list[Step] = field(default_factory=list)  # first runs that failed
    failure: str | None = None  # the peer could not be started or measured


def stream_verdict(step: Step, stall_s: float) -> str | None:
    """Why this stream step was not sustained, or None if every stream was whole (all
    of its content events), none failed and no gap exceeded `stall_s`."""
    if step.failed:
        kinds = ", ".join(f"{k} {v}" for k, v in step.errors.items())
        return f"{step.failed} of {step.measured} streams failed ({kinds})"
    if step.content_events < step.ok * ANSWER_TOKENS:
        return f"{step.ok * ANSWER_TOKENS - step.content_events} content events lost"
    if step.itl_max is not None and step.itl_max > stall_s:
        return f"stalled (a gap of {step.itl_max * 1000:.0f} ms)"
    return None


def generator_busy(step: Step, plan: Plan) -> str | None:
    """Whether the load generator could keep up in this step, if it could not: a core's
    worth of its own CPU (its limit), or its event loop late by half a stall while it
    used less (the 2 cores were saturated, the peer's CPU among them)."""
    cores, lag_ms = step.generator_cores, step.generator_lag * 1000
    if cores >= GENERATOR_SATURATED:
        return f"the load generator saturated ({cores:.2f} of a core): its limit, not the peer's"
    if step.generator_lag >= GENERATOR_LAG_STALLS * plan.stall_s:
        return (
            f"the load generator's own loop {lag_ms:.0f} ms late at {cores:.2f} of a core: "
            "the 2 cores were saturated, the peer's CPU among them, so a gap is not the "
            "peer's alone"
        )
    return None


async def _stream_ramp(result: PeerRound, running: RunningPeer, pids: list[int],
                       upstream_pids: Sequence[int], plan: Plan) -> None:  # fmt: skip
    """Step the streams up; a step that fails is run once more (one scheduling hiccup on
    shared cores must not end the ramp), and the ramp stops when it fails again."""
    retried = []
    stop = "the plan's last step"
    for concurrency in plan.stream_ramp:
        step = await run_step(running, pids, upstream_pids, concurrency, True,
                              plan.stream_ramp_phase)  # fmt: skip
        verdict = stream_verdict(step, plan.stall_s)
        if verdict is not None:
            result.stream_retried.append(step)
            retried.append(f"{concurrency} ({verdict})")
            step = await run_step(running, pids, upstream_pids, concurrency, True,
                                  plan.stream_ramp_phase)  # fmt: skip
            verdict = stream_verdict(step, plan.stall_s)
        result.stream_ramp.append(step)
        if verdict is not None:
            retried.pop()
            stop = f"{concurrency}: {verdict}, twice"
            if (busy := generator_busy(step, plan)) is not None:
                stop += f", with {busy}"
            break
        result.streams_sustained = concurrency
        if (busy := generator_busy(step, plan)) is not None:
            stop = f"{concurrency}: {busy}; not stepped further"
            break
    result.streams_stop = stop + (
        "; passed when run again: " + ", ".join(retried) if retried else ""
    )


async def measure_peer(peer: Peer, upstream: Upstream, upstream_pids: Sequence[int],
                       plan: Plan, round_index: int, position: int) -> PeerRound:  # fmt: skip
    """Start `peer`, measure it, stop it. A failure is recorded, never raised, so one
    peer cannot end the run (the traceback is printed)."""
    result = PeerRound(peer.name, round_index, position)
    started = time.monotonic()
    try:
        running = peer.start(upstream)
    except Exception:
        traceback.print_exc()
        result.failure = "could not start: " + traceback.format_exc(limit=1).strip()[-300:]
        return result
    result.start_s = time.monotonic() - started
    try:
        pids = running.pids()  # its whole tree, once: see step.run_step
        result.processes = len(pids)
        result.idle_rss = rss_bytes(pids) if pids else None
        result.latency = await run_step(running, pids, upstream_pids, 1, False, plan.latency)
        for concurrency in plan.sweep:
            step = await run_step(running, pids, upstream_pids, concurrency, False,
                                  plan.sweep_phase)  # fmt: skip
            result.sweep.append(step)
        result.stream = await run_step(running, pids, upstream_pids, plan.stream_concurrency,
                                       True, plan.stream_phase)  # fmt: skip
        await _stream_ramp(result, running, pids, upstream_pids, plan)
        if pids:
            wait_idle(running.pids)
            result.after_rss = rss_bytes(running.pids())
    except Exception:
        traceback.print_exc()
        result.failure = "failed while measured: " + traceback.format_exc(limit=1).strip()[-300:]
    finally:
        running.stop()
    return result
