"""`run_bench(spec)`: resolve the model, start the workers, run the load (or the sweep)
and make the result."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
from collections.abc import Sequence
from typing import Any, TextIO

from sluicegate.bench.endpoint import Endpoint, parse_endpoint
from sluicegate.bench.figures import run_figures
from sluicegate.bench.http import Exchange, connect
from sluicegate.bench.loops import new_event_loop
from sluicegate.bench.mix import Mix
from sluicegate.bench.progress import ProgressLine
from sluicegate.bench.result import BenchResult
from sluicegate.bench.samples import Sample
from sluicegate.bench.shapes import split
from sluicegate.bench.spec import BenchSpec
from sluicegate.bench.stats import summary
from sluicegate.bench.sweep import sweep
from sluicegate.bench.workers import (
    BenchError,
    LocalWorkers,
    WorkerPool,
    Workers,
    auto_processes,
)

_MODELS_TIMEOUT_S = 30.0


async def run_bench(spec: BenchSpec, progress: TextIO | None = None) -> BenchResult:
    """Run `spec` and return every figure. `progress`: a stream for the live line (the
    command gives stderr when it is a terminal). SpecError for a bad spec, BenchError
    when the run cannot be made (unreachable URL, no model, a worker died)."""
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    endpoint = parse_endpoint(spec.url)
    model = spec.model or await first_model(endpoint, spec)
    # Built once here so that a bad prompt file fails before any worker starts.
    names = Mix(spec, model, endpoint, seed=spec.seed)
    processes = spec.processes or auto_processes(spec)
    workers: Workers
    if processes == 1:
        workers = LocalWorkers(spec, model, endpoint)
    else:
        loop = asyncio.get_running_loop()
        workers = await loop.run_in_executor(
            None, lambda: WorkerPool(spec, model, endpoint, processes)
        )
    line = ProgressLine(workers.counters, progress) if progress is not None else None
    ticker = asyncio.create_task(line.run()) if line is not None else None
    parameters = {**spec.parameters(model), "processes": processes}

    async def phase(load: float) -> dict[str, Any]:
        if line is not None and spec.sweep:
            line.label(f"step {spec.shape} load {load:g}")
        results = await workers.run(split(spec, load, workers.count), spec.duration_s,
                                    spec.warmup_s)  # fmt: skip
        samples: list[Sample] = [s for r in results for s in r.samples]
        samples.sort(key=lambda s: s.start)
        figures = run_figures(samples, spec.warmup_s, spec.objectives, names.scenarios,
                              names.priorities)  # fmt: skip
        dropped = figures["requests"]["dropped"] = sum(r.dropped for r in results)
        if dropped:
            # An arrival the open loop could not send (--max-inflight) is a request the
            # load asked for and did not get: it counts against the error rate and the SLO.
            measured = figures["requests"]["measured"]
            figures["error_rate"] = (figures["requests"]["failed"] + dropped) / (
                measured + dropped
            )
            if "slo" in figures:
                figures["slo"]["checks"].append(
                    {"objective": "dropped", "limit": 0, "value": dropped, "met": False}
                )
                figures["slo"]["met"] = False
        figures["load"] = {"shape": spec.shape, "value": _load_value(spec, load)}
        lags = [lag for r in results for lag in r.lags]
        # The bench's own cost, to tell whether it limited the run: its CPU seconds, and
        # (open loop) how late arrivals were sent after they were due.
        figures["client"] = {
            "processes": processes,
            "cpu_s": sum(r.cpu_s for r in results),
            "schedule_lag": summary(lags) if lags else None,
        }
        return figures

    try:
        if spec.sweep:
            steps, capacity, bounded = await sweep(spec, phase)
            best = next(
                (s for s in steps if capacity is not None
                 and s["load"]["value"] == _load_value(spec, capacity)), steps[-1],
            )  # fmt: skip
            return BenchResult(
                parameters, best, started_at,
                steps=[{k: v for k, v in s.items() if k != "timeline"} for s in steps],
                capacity=_capacity(spec, best, capacity, bounded),
            )  # fmt: skip
        return BenchResult(parameters, await phase(spec.load), started_at)
    finally:
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        workers.close()


def run_bench_sync(spec: BenchSpec, progress: TextIO | None = None) -> BenchResult:
    """`run_bench` on a new uvloop event loop, for callers without one."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(run_bench(spec, progress))


def _load_value(spec: BenchSpec, load: float) -> float | int:
    """A concurrency is a whole number; a rate is not."""
    return int(load) if spec.concurrency is not None else load


def _capacity(
    spec: BenchSpec, figures: dict[str, Any], load: float | None, bounded: bool
) -> dict[str, Any]:
    return {
        "shape": spec.shape,
        "unit": "concurrency" if spec.concurrency is not None else "requests/s",
        "value": _load_value(spec, load) if load is not None else None,
        "requests_per_s": figures["requests_per_s"] if load is not None else None,
        "met": load is not None,
        # False: no step missed the SLO, so the capacity is at least `value`, not found.
        "bounded": bounded,
    }


async def first_model(endpoint: Endpoint, spec: BenchSpec) -> str:
    """The first id of GET {url}/v1/models (the default --model)."""
    url = endpoint.url("/v1/models")
    try:
        connection = await asyncio.wait_for(
            connect(endpoint.host, endpoint.port, frozenset(), endpoint.ssl_context()),
            _MODELS_TIMEOUT_S,
        )
    except (OSError, TimeoutError) as err:
        raise BenchError(f"cannot connect to {url}: {err}") from None
    try:
        lines = [f"GET {endpoint.path_prefix}/v1/models HTTP/1.1",
                 f"Host: {endpoint.host_header}", "User-Agent: sluicegate-bench",
                 "Accept: application/json"]  # fmt: skip
        # Without a key of the run's own, a scenario's (a gateway lists models to tenants).
        key = spec.key or next((s.key for s in spec.scenarios if s.key is not None), None)
        if key is not None:
            lines.append(f"Authorization: Bearer {key.reveal()}")
        lines.extend(f"{name}: {value}" for name, value in spec.headers)
        exchange = Exchange(asyncio.get_running_loop().create_future())
        connection.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), exchange)
        try:
            await asyncio.wait_for(exchange.waiter, _MODELS_TIMEOUT_S)
        except TimeoutError:
            raise BenchError(
                f"{url} did not answer in {_MODELS_TIMEOUT_S:g}s; give --model"
            ) from None
    finally:
        connection.close()
    if exchange.error is not None:
        raise BenchError(f"{url}: {exchange.error}; give --model")
    ids = _model_ids(exchange.body)
    if exchange.status != 200 or not ids:
        code = _code(exchange.body)
        detail = f"HTTP {exchange.status}" + (f" ({code})" if code else "")
        raise BenchError(f"cannot list the models at {url}: {detail}; give --model")
    return ids[0]


def _model_ids(body: bytes) -> Sequence[str]:
    with contextlib.suppress(ValueError, LookupError, AttributeError, TypeError):
        data = json.loads(body).get("data")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    return []


def _code(body: bytes) -> str | None:
    with contextlib.suppress(ValueError, LookupError, AttributeError, TypeError):
        code = json.loads(body)["error"]["code"]
        return str(code) if code is not None else None
    return None
