"""Percentiles and summaries of a list of seconds.

Percentiles interpolate linearly between the two nearest ranks (numpy's default, which
vLLM's benchmark uses), so figures compare with its output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

PERCENTILES: Final = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0))


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `ordered` (sorted ascending, not empty)."""
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def summary(values: Iterable[float]) -> dict[str, Any]:
    """{"unit": "s", "count", "mean", "p50", "p90", "p95", "p99", "max", "min"}; the
    figures are null when there are no values (a JSON answer has no ITL)."""
    ordered = sorted(values)
    out: dict[str, Any] = {"unit": "s", "count": len(ordered)}
    if not ordered:
        out.update({"mean": None, **{name: None for name, _ in PERCENTILES}, "max": None,
                    "min": None})  # fmt: skip
        return out
    out["mean"] = sum(ordered) / len(ordered)
    for name, q in PERCENTILES:
        out[name] = percentile(ordered, q)
    out["max"] = ordered[-1]
    out["min"] = ordered[0]
    return out


def counts(keys: Iterable[object]) -> dict[str, int]:
    """How often each key occurs, as a JSON object sorted by key."""
    tally: dict[str, int] = {}
    for key in keys:
        name = str(key)
        tally[name] = tally.get(name, 0) + 1
    return dict(sorted(tally.items()))
