"""`sluicegate bench compare A.json B.json`: two runs side by side, with B/A."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluicegate.bench.units import format_seconds

_ROWS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("requests/s", ("requests_per_s",), "rate"),
    ("output tokens/s", ("output_tokens_per_s",), "rate"),
    ("goodput %", ("goodput", "percent"), "percent"),
    ("error rate", ("error_rate",), "share"),
    ("gateway refusals", ("refusals", "total"), "count"),
    *(
        (f"{metric} {p}", (metric, p), "seconds")
        for metric in ("ttft", "tpot", "itl", "e2e")
        for p in ("p50", "p90", "p95", "p99", "max")
    ),
    ("queue p95", ("queue", "p95"), "seconds"),
    ("capacity", ("capacity", "value"), "count"),
)


def load_run(path: str | Path) -> dict[str, Any]:
    try:
        document = json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    except ValueError as err:
        raise ValueError(f"{path} is not JSON: {err}") from None
    if not isinstance(document, dict) or document.get("tool") != "sluicegate bench":
        raise ValueError(f"{path} is not a `sluicegate bench --json` file")
    return document


def _get(document: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = document
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _show(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "seconds":
        return format_seconds(value)
    if kind == "share":
        return f"{value * 100:.3g}%"
    if kind == "percent":
        return f"{value:.1f}%"
    if kind == "count":
        return f"{value:g}"
    return f"{value:.1f}"


def render_comparison(a: Mapping[str, Any], b: Mapping[str, Any], a_name: str,
                      b_name: str) -> str:  # fmt: skip
    width = max(12, len(a_name), len(b_name)) + 2
    lines = [f"A: {a_name}  ({_describe(a)})", f"B: {b_name}  ({_describe(b)})", "",
             f"{'':<18}{'A':>{width}}{'B':>{width}}{'B/A':>9}"]  # fmt: skip
    for label, path, kind in _ROWS:
        first, second = _get(a, path), _get(b, path)
        if first is None and second is None:
            continue
        ratio = f"{second / first:.3f}" if first and second is not None else "-"
        lines.append(
            f"{label:<18}{_show(first, kind):>{width}}{_show(second, kind):>{width}}{ratio:>9}"
        )
    return "\n".join(lines) + "\n"


def _describe(document: Mapping[str, Any]) -> str:
    p = document.get("parameters", {})
    load = f"concurrency {p.get('concurrency')}" if p.get("shape") == "closed" else (
        f"rate {p.get('rate')}/s"
    )  # fmt: skip
    return f"{p.get('url')}, {'streamed' if p.get('stream') else 'JSON'}, {load}"
