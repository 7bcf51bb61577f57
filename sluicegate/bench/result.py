"""A run's result: its parameters and every figure; `to_json()` is the `--json` file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

FORMAT_VERSION: Final = 1


@dataclass
class BenchResult:
    """`figures`: the run's (for a sweep, the capacity step's, else the last step's).
    `steps` and `capacity` only for a sweep."""

    parameters: dict[str, Any]
    figures: dict[str, Any]
    started_at: str
    steps: list[dict[str, Any]] | None = None
    capacity: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "tool": "sluicegate bench",
            "format": FORMAT_VERSION,
            "started_at": self.started_at,
            "parameters": self.parameters,
            **self.figures,
        }
        if self.steps is not None:
            document["steps"] = self.steps
            document["capacity"] = self.capacity
        return document

    # Shortcuts for Python callers; everything else is in to_json().

    @property
    def requests_per_s(self) -> float:
        return float(self.figures["requests_per_s"])

    @property
    def error_rate(self) -> float | None:
        value = self.figures["error_rate"]
        return float(value) if value is not None else None

    def latency(self, metric: str, percentile: str = "p50") -> float | None:
        """`latency("e2e", "p99")`: seconds, None without samples."""
        value = self.figures[metric][percentile]
        return float(value) if value is not None else None
