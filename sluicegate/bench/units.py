"""Durations and percentages as written on the command line: `250ms`, `2s`, `1.5m`, `0.1%`.

Its own parser, not config's: a bench objective may be below a millisecond (an ITL of
`500us`), and the bench imports nothing of the gateway (docs/bench.md, "Where it lives").
"""

from __future__ import annotations

import math
import re

_UNIT_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(us|µs|ms|s|m|h)")


def parse_seconds(text: str) -> float:
    """`"1.5m"` -> 90.0, `"250ms"` -> 0.25, `"1m30s"` -> 90.0; ValueError otherwise.

    A bare number needs a unit, so `2` (seconds? milliseconds?) is refused."""
    cleaned = text.strip().lower()
    position, total = 0, 0.0
    for match in _DURATION.finditer(cleaned):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        position = match.end()
    if not cleaned or position != len(cleaned) or not math.isfinite(total):
        raise ValueError(f"expected a duration such as 250ms, 2s or 1.5m, got {text!r}")
    return total


def parse_fraction(text: str) -> float:
    """`"0.1%"` -> 0.001, `"0.02"` -> 0.02: a share of requests, between 0 and 1."""
    cleaned = text.strip()
    try:
        value = float(cleaned[:-1]) / 100 if cleaned.endswith("%") else float(cleaned)
    except ValueError:
        raise ValueError(f"expected a share such as 0.1% or 0.001, got {text!r}") from None
    if not 0.0 <= value <= 1.0 or not math.isfinite(value):
        raise ValueError(f"a share must be within 0..100%, got {text!r}")
    return value


def format_seconds(seconds: float) -> str:
    """0.0123 -> "12.3ms", 2.5 -> "2.50s": for tables and messages."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.2f}s"
