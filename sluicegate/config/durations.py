"""Durations as written in sluicegate's YAML: `250ms`, `3s`, `1.5s`, `2m`, `1h`, `1m30s`.

Its own module so that every section (resilience, admission, schema) can use `Duration`
without importing another section's module.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_UNITS_MS = {"ms": 1.0, "s": 1_000.0, "m": 60_000.0, "h": 3_600_000.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
MAX_DURATION_MS = 365 * 24 * 3_600_000  # protobuf Durations are bounded; a year is plenty


def parse_duration_ms(value: object) -> int:
    """`"1m30s"` -> 90000. A bare 0 means zero; any other bare number needs a unit."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s or 250ms, got boolean {value}")
    if isinstance(value, int | float):
        if value == 0:
            return 0
        raise ValueError(f"a duration needs a unit: write {value}s or {value}ms, not {value}")
    if not isinstance(value, str):
        raise ValueError("expected a duration such as 30s or 250ms")
    text = value.strip().lower()
    if text == "0":
        return 0
    position, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNITS_MS[match.group(2)]
        position = match.end()
    if position != len(text) or not text:
        raise ValueError(f"expected a duration such as 30s, 250ms, 2m or 1m30s, got {value!r}")
    if total > MAX_DURATION_MS:
        raise ValueError(f"duration {value!r} is longer than a year")
    milliseconds = round(total)
    if total > 0 and milliseconds == 0:
        raise ValueError(f"duration {value!r} is shorter than 1ms")
    return milliseconds


def format_duration_ms(milliseconds: int) -> str:
    """90000 -> "90s", 1500 -> "1500ms" (messages and docs)."""
    if milliseconds % 1000 == 0:
        return f"{milliseconds // 1000}s"
    return f"{milliseconds}ms"


# Milliseconds, written in YAML as a duration string.
Duration = Annotated[int, BeforeValidator(parse_duration_ms)]
