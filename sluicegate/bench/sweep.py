"""`--sweep`: the highest load still meeting the SLO.

From the start load (--rate or --concurrency), each step runs the whole --duration (or
--requests) and multiplies the load by --sweep-factor until a step fails the SLO; then
it bisects between the last step that met it and the first that did not, until they are
within --sweep-resolution of each other (1 apart for concurrency) or --sweep-steps have
run. The capacity is the highest load that met the SLO; none if the start failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sluicegate.bench.spec import BenchSpec

RunStep = Callable[[float], Awaitable[dict[str, Any]]]


async def sweep(
    spec: BenchSpec, run_step: RunStep
) -> tuple[list[dict[str, Any]], float | None, bool]:
    """Run the steps (`run_step(load)` returns a step's figures, with `slo.met`);
    returns every step's figures in the order run, the capacity found, and whether a
    step missed above it (False: every step met the SLO, so the capacity is only a lower
    bound, --sweep-steps ran out first)."""
    closed = spec.concurrency is not None
    steps: list[dict[str, Any]] = []
    met_at: float | None = None
    failed_at: float | None = None
    load = spec.load

    async def step(value: float) -> bool:
        figures = await run_step(value)
        steps.append(figures)
        return bool(figures["slo"]["met"])

    while len(steps) < spec.sweep_steps:
        if not await step(load):
            failed_at = load
            break
        met_at = load
        grown = load * spec.sweep_factor
        load = max(load + 1, round(grown)) if closed else grown
    while met_at is not None and failed_at is not None and len(steps) < spec.sweep_steps:
        if closed:
            if failed_at - met_at <= 1:
                break
            middle = float((int(met_at) + int(failed_at)) // 2)
        else:
            if (failed_at - met_at) / met_at <= spec.sweep_resolution:
                break
            middle = (met_at + failed_at) / 2
        if await step(middle):
            met_at = middle
        else:
            failed_at = middle
    return steps, met_at, failed_at is not None
