"""One load step through one peer: `sluicegate bench`'s engine (its Python API, one
process: the load generator of every step, so its ceiling is measured through `direct`)
at one concurrency for a warm-up and a measured window, with the CPU of the peer's whole
process tree, of the upstream's and of the generator itself over that window, and the
peer's RSS at its end (the load still running).

CPU is sampled at the end of the warm-up and at the end of the window, while the closed
loop keeps its concurrency in flight: in that steady state as many requests finish as
start, so CPU over the window divided by the requests sent in it is the cost of one,
with no start-up or draining counted. Streams are asked without a usage event, so the
bench counts each stream's content events (a chunk lost shows as fewer tokens).

Requests/s here are the answered requests sent in the window over the window's length:
in a closed loop's steady state, the rate they are answered at. The bench's own figure
divides by the window and the drain after it (until the last answer), which for a
gateway answering in seconds (LiteLLM at concurrency 128) is several times the window
and would understate what it carried."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.peers import RunningPeer
from benchmarks.peers.processes import rss_bytes, tree_cpu_s
from sluicegate.bench import BenchSpec, run_bench

from .plan import ANSWER_TOKENS, INPUT_TOKENS, Phase

# The generator's own lag: how late its event loop runs a timer of this period.
LAG_TICK_S = 0.005
# Far above any answer here; a request this late counts as a failure (a timeout).
REQUEST_TIMEOUT_S = 30.0


@dataclass
class Step:
    """One step's figures (seconds; CPU in µs per request sent; None without samples).
    `*_cores`: the share of a core each tree spent over the window."""

    concurrency: int
    stream: bool
    measured: int
    ok: int
    failed: int
    errors: dict[str, int]  # by kind, then by HTTP status
    requests_per_s: float  # answered requests sent in the window, per second of it
    bench_requests_per_s: float  # the bench's: over the window and the drain after it
    e2e_p50: float | None
    e2e_p99: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p99: float | None
    itl_max: float | None
    itl_mean: float | None
    content_events: int  # over the ok requests (streams: every content event)
    peer_cpu_us: float | None  # None for `direct` (no process of its own)
    upstream_cpu_us: float
    generator_cpu_us: float
    peer_cores: float
    upstream_cores: float
    generator_cores: float
    generator_lag: float  # the most a 5 ms timer of the generator's event loop was late
    peer_rss: int | None


@dataclass(frozen=True)
class _Sample:
    at: float
    peer_cpu: float
    upstream_cpu: float
    generator_cpu: float


def bench_spec(peer: RunningPeer, concurrency: int, stream: bool, phase: Phase) -> BenchSpec:
    """The bench's spec for `peer`: its Authorization header as the bench's key (hidden
    in every output), its other headers as they are."""
    key = None
    headers = []
    for name, value in peer.headers.items():
        if name.lower() == "authorization" and value.startswith("Bearer "):
            key = value.removeprefix("Bearer ")
        else:
            headers.append((name, value))
    return BenchSpec(
        url=peer.url, api_key=key, model=peer.model, stream=stream, stream_usage=False,
        concurrency=concurrency, duration_s=phase.duration_s, warmup_s=phase.warmup_s,
        input_tokens=INPUT_TOKENS, output_tokens=f"fixed:{ANSWER_TOKENS}", processes=1,
        timeout_s=REQUEST_TIMEOUT_S, headers=tuple(headers),
    )  # fmt: skip


def _sample(peer_pids: list[int], upstream_pids: list[int]) -> _Sample:
    return _Sample(time.perf_counter(), tree_cpu_s(peer_pids), tree_cpu_s(upstream_pids),
                   time.process_time())  # fmt: skip


def _per_request(cpu_s: float, elapsed_s: float, requests_per_s: float) -> float:
    """µs of CPU per request from a rate of CPU and a rate of requests."""
    return 1e6 * (cpu_s / elapsed_s) / requests_per_s if requests_per_s > 0 else float("nan")


async def _loop_lag(until: float, lags: list[float]) -> None:
    """How late this process's event loop (the generator's) runs a 5 ms timer, until
    `until`: a loop late by tens of ms is a generator that would see a gap in every stream
    whatever the peer did."""
    while (now := time.perf_counter()) < until:
        await asyncio.sleep(LAG_TICK_S)
        lags.append(time.perf_counter() - now - LAG_TICK_S)


async def run_step(peer: RunningPeer, pids: Sequence[int], upstream_pids: Sequence[int],
                   concurrency: int, stream: bool, phase: Phase) -> Step:  # fmt: skip
    """One step through `peer`, whose process tree is `pids` (and the upstream's
    `upstream_pids`), listed before: listing a tree scans all of /proc once per process
    in it, tens of ms in which this process, the load generator, would send nothing and
    read nothing (a gap in every stream, a tail on every latency)."""
    spec = bench_spec(peer, concurrency, stream, phase)
    peer_pids, upstream = list(pids), list(upstream_pids)
    started = time.perf_counter()
    running = asyncio.create_task(run_bench(spec))
    await asyncio.sleep(phase.warmup_s)
    first = _sample(peer_pids, upstream)
    lags: list[float] = []
    await _loop_lag(started + phase.total_s, lags)
    last = _sample(peer_pids, upstream)
    rss = rss_bytes(peer_pids) if peer_pids else None
    figures = (await running).to_json()
    step = step_of(figures, concurrency, stream, phase, first, last, rss, bool(peer_pids))
    step.generator_lag = max(lags, default=0.0)
    return step


def step_of(figures: dict[str, Any], concurrency: int, stream: bool, phase: Phase,
            first: _Sample, last: _Sample, rss: int | None, has_tree: bool) -> Step:  # fmt: skip
    requests = figures["requests"]
    # Requests sent in the window, a second: in a closed loop's steady state, answered too.
    sent_per_s = requests["measured"] / phase.duration_s
    elapsed = max(last.at - first.at, 1e-9)
    peer_cpu = last.peer_cpu - first.peer_cpu
    upstream_cpu = last.upstream_cpu - first.upstream_cpu
    generator_cpu = last.generator_cpu - first.generator_cpu
    errors = figures["errors"]
    by_kind = {str(k): int(v) for k, v in errors["by_kind"].items()}
    by_status = {f"HTTP {k}": int(v) for k, v in errors["by_status"].items()}
    refusals = figures["refusals"]["total"]
    if refusals:
        by_kind["refusal"] = int(refusals)
    e2e, ttft, itl = figures["e2e"], figures["ttft"], figures["itl"]
    return Step(
        concurrency=concurrency, stream=stream, measured=requests["measured"],
        ok=requests["ok"], failed=requests["failed"], errors={**by_kind, **by_status},
        requests_per_s=requests["ok"] / phase.duration_s,
        bench_requests_per_s=figures["requests_per_s"],
        e2e_p50=e2e["p50"], e2e_p99=e2e["p99"], ttft_p50=ttft["p50"], ttft_p99=ttft["p99"],
        itl_p50=itl["p50"], itl_p99=itl["p99"], itl_max=itl["max"], itl_mean=itl["mean"],
        content_events=figures["output_tokens"],
        peer_cpu_us=_per_request(peer_cpu, elapsed, sent_per_s) if has_tree else None,
        upstream_cpu_us=_per_request(upstream_cpu, elapsed, sent_per_s),
        generator_cpu_us=_per_request(generator_cpu, elapsed, sent_per_s),
        peer_cores=peer_cpu / elapsed, upstream_cores=upstream_cpu / elapsed,
        generator_cores=generator_cpu / elapsed, generator_lag=0.0, peer_rss=rss,
    )  # fmt: skip
