"""Across rounds: each figure per round, differences and ratios taken within a round
(against `direct`, or between two peers), and medians of those across rounds."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence

from .peer_round import PeerRound
from .step import Step

DIRECT = "direct"
Figure = Callable[[PeerRound], float | None]


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that exist (None and NaN left out); None when none do."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(kept) if kept else None


class Rounds:
    """Every PeerRound of a run, by round and by peer."""

    def __init__(self, results: Sequence[PeerRound]) -> None:
        self.table: dict[int, dict[str, PeerRound]] = {}
        for result in results:
            self.table.setdefault(result.round, {})[result.name] = result

    @property
    def count(self) -> int:
        return len(self.table)

    def of(self, name: str) -> list[PeerRound]:
        """`name`'s rounds that were measured (a failed start is left out)."""
        return [r[name] for r in self.table.values() if name in r and r[name].failure is None]

    def values(self, name: str, figure: Figure) -> list[float]:
        return [v for v in (figure(r) for r in self.of(name)) if v is not None]

    def median(self, name: str, figure: Figure) -> float | None:
        return median(figure(r) for r in self.of(name))

    def pairs(self, a: str, b: str, figure: Figure) -> list[tuple[float, float]]:
        """(figure of a, figure of b) in each round where both have it."""
        found = []
        for peers in self.table.values():
            if a in peers and b in peers and not (peers[a].failure or peers[b].failure):
                x, y = figure(peers[a]), figure(peers[b])
                if x is not None and y is not None:
                    found.append((x, y))
        return found

    def within(self, names: Sequence[str],
               figure: Callable[[dict[str, PeerRound]], float | None]) -> list[float]:  # fmt: skip
        """figure(the round's PeerRounds) in each round where every one of `names` was
        measured."""
        found = []
        for peers in self.table.values():
            if all(n in peers and peers[n].failure is None for n in names):
                value = figure(peers)
                if value is not None and not math.isnan(value):
                    found.append(value)
        return found

    def added(self, name: str, figure: Figure) -> list[float]:
        """name's figure minus direct's, per round."""
        return [x - y for x, y in self.pairs(name, DIRECT, figure)]

    def ratios(self, a: str, b: str, figure: Figure) -> list[float]:
        """a's figure over b's, per round."""
        return [x / y for x, y in self.pairs(a, b, figure) if y]


def sweep_step(result: PeerRound, concurrency: int) -> Step | None:
    return next((s for s in result.sweep if s.concurrency == concurrency), None)


def ramp_step(result: PeerRound, concurrency: int) -> Step | None:
    return next((s for s in result.stream_ramp if s.concurrency == concurrency), None)


def frontier(result: PeerRound, p99_limit_s: float | None) -> float:
    """The most requests/s of a sweep step with no failed request and its e2e p99 at or
    under the limit (None: any p99); 0 when no step qualifies."""
    return max(
        (s.requests_per_s for s in result.sweep
         if s.failed == 0 and s.e2e_p99 is not None
         and (p99_limit_s is None or s.e2e_p99 <= p99_limit_s)),
        default=0.0,
    )  # fmt: skip


def peak_rss(result: PeerRound) -> float | None:
    seen = [s.peer_rss for s in [*result.sweep, *result.stream_ramp] if s.peer_rss is not None]
    if result.stream is not None and result.stream.peer_rss is not None:
        seen.append(result.stream.peer_rss)
    return float(max(seen)) if seen else None
