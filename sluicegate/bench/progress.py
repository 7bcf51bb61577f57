"""The live progress line on stderr: elapsed, sent, done, in flight, req/s, errors and the
TTFT p95 so far, summed over every worker process.

Each worker counts into its own row of numbers (a list, or a row of shared memory for a
worker process); TTFTs go into log-spaced buckets (8 per doubling, about 9% wide), enough
for a p95 on a progress line and as cheap as an increment.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Sequence
from typing import Final, Protocol, TextIO

from sluicegate.bench.units import format_seconds

SENT, DONE, FAILED, INFLIGHT, DROPPED = range(5)
_HIST: Final = 5
_BUCKETS: Final = 200
_BASE_S: Final = 1e-5
_PER_DOUBLING: Final = 8
WIDTH: Final = _HIST + _BUCKETS  # numbers per worker


class Numbers(Protocol):
    """A list of floats, or a memoryview of doubles over shared memory."""

    def __getitem__(self, index: int, /) -> float: ...

    def __setitem__(self, index: int, value: float, /) -> None: ...


class Counters:
    """One worker's row: `values[offset:offset + WIDTH]`."""

    __slots__ = ("offset", "values")

    def __init__(self, values: Numbers | None = None, offset: int = 0) -> None:
        self.values: Numbers = values if values is not None else [0.0] * WIDTH
        self.offset = offset

    def add(self, field: int, amount: float = 1.0) -> None:
        self.values[self.offset + field] += amount

    def ttft(self, seconds: float) -> None:
        bucket = int(math.log2(max(seconds, _BASE_S) / _BASE_S) * _PER_DOUBLING)
        self.values[self.offset + _HIST + min(bucket, _BUCKETS - 1)] += 1

    def row(self) -> list[float]:
        return [self.values[self.offset + index] for index in range(WIDTH)]


def totals(rows: Sequence[Sequence[float]]) -> list[float]:
    return [sum(column) for column in zip(*rows, strict=True)] if rows else [0.0] * WIDTH


def ttft_p95(total: Sequence[float]) -> float | None:
    counts = total[_HIST:]
    count = sum(counts)
    if not count:
        return None
    wanted, running = 0.95 * count, 0.0
    for bucket, n in enumerate(counts):
        running += n
        if running >= wanted:
            return float(_BASE_S * 2 ** ((bucket + 1) / _PER_DOUBLING))
    return None  # pragma: no cover - running reaches count


def render(total: Sequence[float], elapsed: float, rate: float) -> str:
    p95 = ttft_p95(total)
    return (
        f"{elapsed:6.1f}s  sent {int(total[SENT])}  done {int(total[DONE])}  "
        f"in-flight {int(total[INFLIGHT])}  {rate:.1f} req/s  errors {int(total[FAILED])}"
        + (f"  dropped {int(total[DROPPED])}" if total[DROPPED] else "")
        + f"  ttft p95 {format_seconds(p95) if p95 is not None else '-'}"
    )


class ProgressLine:
    """Redraws one line every `interval` seconds while `run()` is awaited (a task)."""

    def __init__(
        self, rows: Sequence[Counters], stream: TextIO | None = None, interval: float = 0.5
    ) -> None:
        self._rows = rows
        self._stream = stream or sys.stderr
        self._interval = interval
        self._label = ""

    def label(self, text: str) -> None:
        """A prefix, such as the sweep step being run."""
        self._label = text + "  " if text else ""

    async def run(self) -> None:
        started = time.perf_counter()
        last_time, last_done = started, 0.0
        try:
            while True:
                await asyncio.sleep(self._interval)
                now = time.perf_counter()
                total = totals([row.row() for row in self._rows])
                rate = (total[DONE] - last_done) / max(now - last_time, 1e-9)
                last_time, last_done = now, total[DONE]
                line = self._label + render(total, now - started, rate)
                self._stream.write("\r\x1b[K" + line)
                self._stream.flush()
        finally:
            with contextlib.suppress(Exception):
                self._stream.write("\r\x1b[K")
                self._stream.flush()
