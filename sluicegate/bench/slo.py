"""Objectives: `--slo ttft_p95=2s,tpot_p95=80ms,e2e_p99=30s,itl_p99=50ms,error_rate=0.1%`.

A run (or a sweep step) meets the SLO when every percentile is at or under its limit and
the share of failed requests is at or under `error_rate`. A request is *good* (goodput)
when it succeeded and its own TTFT, TPOT and E2E are each at or under the limit given for
that metric (any percentile's: the tightest). ITL is a gap, not a request's figure, so it
takes no part in goodput (docs/bench.md, "Goodput").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sluicegate.bench.units import format_seconds, parse_fraction, parse_seconds

METRICS: Final = ("ttft", "tpot", "itl", "e2e")
PERCENTILES: Final = ("p50", "p90", "p95", "p99")
PER_REQUEST: Final = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class Objective:
    metric: str  # ttft | tpot | itl | e2e
    percentile: str  # p50 | p90 | p95 | p99
    limit_s: float

    @property
    def key(self) -> str:
        return f"{self.metric}_{self.percentile}"


@dataclass(frozen=True)
class Slo:
    objectives: tuple[Objective, ...] = ()
    error_rate: float | None = None
    text: str = ""

    def per_request_limits(self) -> dict[str, float]:
        """metric -> the tightest limit given for it (for goodput)."""
        limits: dict[str, float] = {}
        for objective in self.objectives:
            if objective.metric in PER_REQUEST:
                current = limits.get(objective.metric)
                limits[objective.metric] = (
                    objective.limit_s if current is None else min(current, objective.limit_s)
                )
        return limits

    def check(self, figures: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Each objective against a group's figures (report.group_figures' dict):
        [{objective, limit, value, met}]. A percentile with no samples is not met."""
        checks: list[dict[str, Any]] = []
        for objective in self.objectives:
            summary = figures.get(objective.metric) or {}
            value = summary.get(objective.percentile)
            met = value is not None and value <= objective.limit_s
            checks.append(
                {"objective": objective.key, "limit": objective.limit_s, "value": value,
                 "met": met}
            )  # fmt: skip
        if self.error_rate is not None:
            value = figures.get("error_rate")
            met = value is not None and value <= self.error_rate
            checks.append(
                {"objective": "error_rate", "limit": self.error_rate, "value": value, "met": met}
            )
        return checks

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {o.key: o.limit_s for o in self.objectives}
        if self.error_rate is not None:
            out["error_rate"] = self.error_rate
        return out

    def describe(self) -> str:
        parts = [f"{o.key}<={format_seconds(o.limit_s)}" for o in self.objectives]
        if self.error_rate is not None:
            parts.append(f"error_rate<={self.error_rate * 100:g}%")
        return ", ".join(parts)


def parse_slo(text: str) -> Slo:
    """ValueError naming the bad token, e.g. `ttft_p97=2s: unknown objective ...`."""
    objectives: list[Objective] = []
    error_rate: float | None = None
    seen: set[str] = set()
    tokens = [token.strip() for token in text.split(",") if token.strip()]
    if not tokens:
        raise ValueError("no objectives given (e.g. ttft_p95=2s,error_rate=0.1%)")
    for token in tokens:
        key, eq, value = token.partition("=")
        key = key.strip().lower()
        if not eq or not value.strip():
            raise ValueError(f"{token!r}: expected KEY=VALUE, e.g. ttft_p95=2s")
        if key in seen:
            raise ValueError(f"{token!r}: {key} given twice")
        seen.add(key)
        if key == "error_rate":
            try:
                error_rate = parse_fraction(value)
            except ValueError as err:
                raise ValueError(f"{token!r}: {err}") from None
            continue
        metric, _, percentile = key.partition("_")
        if metric not in METRICS or percentile not in PERCENTILES:
            keys = ", ".join(f"{m}_{{{'|'.join(PERCENTILES)}}}" for m in METRICS)
            raise ValueError(f"{token!r}: unknown objective {key!r}; known: {keys}, error_rate")
        try:
            limit = parse_seconds(value)
        except ValueError as err:
            raise ValueError(f"{token!r}: {err}") from None
        objectives.append(Objective(metric, percentile, limit))
    return Slo(tuple(objectives), error_rate, text.strip())
