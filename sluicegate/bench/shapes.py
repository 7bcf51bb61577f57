"""Load shapes, and how one is shared among worker processes.

Closed loop: N slots, each sending its next request when its last one is answered; a
ramp turns slots on (or off) as the target concurrency passes their number. Open loop:
Poisson arrivals at R requests/s that never wait for answers (a ramp moves R linearly);
P workers each run a Poisson process at R/P, whose sum is again Poisson at R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluicegate.bench.spec import BenchSpec


@dataclass(frozen=True)
class WorkerLoad:
    """One worker's part of a phase's load."""

    shape: str  # closed | open
    slots: tuple[int, ...] = ()  # closed: the global numbers of this worker's slots
    ramp: tuple[float, float] | None = None  # closed: global concurrency; open: own rate
    rate: float = 0.0  # open: this worker's rate
    requests: int | None = None  # this worker's share of --requests
    max_inflight: int = 1

    @property
    def idle(self) -> bool:
        if self.requests == 0:
            return True
        return not self.slots if self.shape == "closed" else self.rate <= 0 and not self.ramp


def split(spec: BenchSpec, load: float, workers: int) -> list[WorkerLoad]:
    """`load` (concurrency or rate: a sweep step's, else the spec's) shared by `workers`;
    --requests in proportion to each worker's slots (closed loop) or rate (open loop)."""
    max_inflight = max(1, spec.max_inflight // workers)
    if spec.concurrency is None:
        ramp = (spec.ramp[0] / workers, spec.ramp[1] / workers) if spec.ramp else None
        requests = _shares(spec.requests, [1] * workers)
        return [
            WorkerLoad("open", ramp=ramp, rate=load / workers, requests=requests[index],
                       max_inflight=max_inflight)
            for index in range(workers)
        ]  # fmt: skip
    top = math.ceil(max(spec.ramp)) if spec.ramp else int(load)
    slots = [tuple(range(index, top, workers)) for index in range(workers)]
    requests = _shares(spec.requests, [len(own) for own in slots])
    return [
        WorkerLoad("closed", slots=slots[index], ramp=spec.ramp, requests=requests[index])
        for index in range(workers)
    ]


def _shares(total: int | None, weights: list[int]) -> list[int | None]:
    """`total` divided in proportion to `weights`, the remainder to the first ones."""
    if total is None:
        return [None] * len(weights)
    whole = sum(weights)
    if whole == 0:
        return [0] * len(weights)
    shares = [total * weight // whole for weight in weights]
    left = total - sum(shares)
    for index, weight in enumerate(weights):
        if left and weight:
            shares[index] += 1
            left -= 1
    return list(shares)


def slot_window(slot: int, ramp: tuple[float, float] | None, warm_end: float,
                duration: float | None) -> tuple[float, float]:  # fmt: skip
    """When closed-loop slot number `slot` runs, in absolute times [on, off). During the
    warm-up the ramp stays at its start; over the duration it moves linearly."""
    if ramp is None or duration is None:
        return -math.inf, math.inf
    low, high = ramp
    if high == low:
        return (-math.inf, math.inf) if low > slot else (math.inf, math.inf)
    # the target passes `slot` at fraction u of the duration: low + (high - low) u = slot
    crossing = warm_end + (slot - low) / (high - low) * duration
    if high > low:
        return (-math.inf if low > slot else crossing), math.inf
    return -math.inf, (math.inf if high > slot else crossing)


def peak_rate(load: WorkerLoad) -> float:
    """The highest rate `rate_at` gives over the run: the bound arrivals are thinned from."""
    return load.rate if load.ramp is None else max(load.ramp[0], load.ramp[1], load.rate)


def rate_at(load: WorkerLoad, now: float, warm_end: float, duration: float | None) -> float:
    if load.ramp is None or duration is None:
        return load.rate
    low, high = load.ramp
    progress = min(1.0, max(0.0, (now - warm_end) / duration))
    return low + (high - low) * progress
