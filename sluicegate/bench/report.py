"""The final table on stdout: overall, per scenario and per priority, then errors,
refusals, queue time, the SLO and, for a sweep, every step and the capacity. Reads the
JSON document (BenchResult.to_json()), so a saved run prints the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.bench.mix import DEFAULT_SCENARIO, NO_PRIORITY
from sluicegate.bench.units import format_seconds

_COLUMNS = (
    ("", 22), ("requests", 9), ("ok%", 6), ("req/s", 9), ("out tok/s", 10),
    ("ttft p50", 9), ("p95", 8), ("p99", 8), ("tpot p50", 9), ("p95", 8),
    ("itl p99", 8), ("e2e p50", 9), ("p99", 8), ("goodput", 8), ("errors", 7),
    ("refused", 8),
)  # fmt: skip


def _latency(figures: Mapping[str, Any], metric: str, percentile: str) -> str:
    value = (figures.get(metric) or {}).get(percentile)
    return format_seconds(value) if value is not None else "-"


def _row(name: str, figures: Mapping[str, Any]) -> str:
    requests = figures["requests"]
    measured = requests["measured"]
    goodput = figures.get("goodput")
    cells = [
        name,
        str(measured),
        f"{100.0 * requests['ok'] / measured:.1f}" if measured else "-",
        f"{figures['requests_per_s']:.1f}",
        f"{figures['output_tokens_per_s']:.0f}",
        _latency(figures, "ttft", "p50"), _latency(figures, "ttft", "p95"),
        _latency(figures, "ttft", "p99"), _latency(figures, "tpot", "p50"),
        _latency(figures, "tpot", "p95"), _latency(figures, "itl", "p99"),
        _latency(figures, "e2e", "p50"), _latency(figures, "e2e", "p99"),
        f"{goodput['percent']:.1f}%" if goodput and goodput["percent"] is not None else "-",
        str(figures["errors"]["total"]),
        str(figures["refusals"]["total"]),
    ]  # fmt: skip
    return _line(cells)


def _line(cells: list[str]) -> str:
    first = f"{cells[0]:<{_COLUMNS[0][1]}}"
    rest = "".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells[1:], _COLUMNS[1:],
                                                                   strict=True))  # fmt: skip
    return (first + rest).rstrip()


def _header(parameters: Mapping[str, Any]) -> str:
    stream = "streamed" if parameters["stream"] else "JSON answers"
    if parameters["shape"] == "closed":
        shape = f"closed loop, concurrency {parameters['concurrency']}"
    else:
        shape = f"open loop (Poisson), {parameters['rate']:g} req/s"
    if parameters.get("ramp"):
        low, high = parameters["ramp"]
        shape += f", ramp {low:g} -> {high:g}"
    if parameters.get("sweep"):
        shape += f", sweep from {parameters['concurrency'] or parameters['rate']:g}"
    bound = (
        f"{parameters['duration_s']:g}s" if parameters["duration_s"] is not None
        else f"{parameters['requests']} requests"
    )  # fmt: skip
    if parameters["warmup_s"]:
        bound += f" after {parameters['warmup_s']:g}s of warm-up"
    return (
        f"sluicegate bench: {parameters['url']}  model {parameters['model']}  {stream}  "
        f"{shape}  {bound}  processes {parameters['processes']}"
    )


def _tally(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{key} x{value}" for key, value in counts.items())


def _details(figures: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    errors = figures["errors"]
    if errors["total"]:
        parts = []
        if errors["by_status"]:
            parts.append("status " + _tally(errors["by_status"]))
        if errors["by_code"]:
            parts.append("code " + _tally(errors["by_code"]))
        kinds = {k: v for k, v in errors["by_kind"].items() if k != "http"}
        if kinds:
            parts.append(_tally(kinds))
        lines.append(f"errors: {errors['total']} ({'; '.join(parts)})")
    refusals = figures["refusals"]
    if refusals["total"]:
        text = (
            f"gateway refusals: {refusals['total']} (status {_tally(refusals['by_status'])}; "
            f"code {_tally(refusals['by_code'])})"
        )
        retry = refusals.get("retry_after")
        if retry:
            text += f"; Retry-After p50 {retry['p50']:g}s, max {retry['max']:g}s"
        lines.append(text)
    queue = figures.get("queue")
    if queue:
        lines.append(
            f"queue time: p50 {format_seconds(queue['p50'])}, p95 {format_seconds(queue['p95'])}"
            f", p99 {format_seconds(queue['p99'])} ({queue['count']} requests reported it)"
        )
    if figures["requests"].get("dropped"):
        lines.append(
            f"dropped: {figures['requests']['dropped']} arrivals not sent (--max-inflight)"
        )
    slo = figures.get("slo")
    if slo:
        checks = []
        for check in slo["checks"]:
            value = check["value"]
            if check["objective"] == "error_rate":
                shown = f"{value * 100:.3g}%" if value is not None else "-"
                limit = f"{check['limit'] * 100:g}%"
            else:
                shown = format_seconds(value) if value is not None else "-"
                limit = format_seconds(check["limit"])
            verdict = "ok" if check["met"] else "MISSED"
            checks.append(f"{check['objective']} {shown} <= {limit} {verdict}")
        lines.append(f"slo: {'met' if slo['met'] else 'NOT met'} ({'; '.join(checks)})")
    return lines


def _steps(document: Mapping[str, Any]) -> list[str]:
    unit = document["capacity"]["unit"]
    lines = ["", f"sweep steps ({unit}):",
             _line(["load", "requests", "ok%", "req/s", "out tok/s", "ttft p50", "p95", "p99",
                    "tpot p50", "p95", "itl p99", "e2e p50", "p99", "goodput", "errors",
                    "refused"])]  # fmt: skip
    for step in document["steps"]:
        mark = "met" if step["slo"]["met"] else "missed"
        lines.append(_row(f"{step['load']['value']:g} {mark}", step))
    capacity = document["capacity"]
    if capacity["value"] is None:
        lines.append("capacity: none: even the first step missed the SLO; start lower")
    elif not capacity.get("bounded", True):
        lines.append(
            f"capacity: at least {unit} {capacity['value']:g} "
            f"({capacity['requests_per_s']:.1f} req/s): every step met the SLO; "
            "start higher or allow more --sweep-steps"
        )
    else:
        lines.append(
            f"capacity: {unit} {capacity['value']:g} ({capacity['requests_per_s']:.1f} req/s) "
            "is the highest load that met the SLO"
        )
    return lines


def render(document: Mapping[str, Any]) -> str:
    lines = [_header(document["parameters"]), "", _line([name for name, _ in _COLUMNS])]
    lines.append(_row("all", document))
    # Rows per scenario and per priority once the run has any (not only the default).
    if set(document["scenarios"]) != {DEFAULT_SCENARIO}:
        for name, figures in document["scenarios"].items():
            lines.append(_row(f"scenario {name}", figures))
    if set(document["priorities"]) != {NO_PRIORITY}:
        for name, figures in document["priorities"].items():
            lines.append(_row(f"priority {name}", figures))
    details = _details(document)
    if details:
        lines.append("")
        lines.extend(details)
    if document.get("steps") is not None:
        lines.extend(_steps(document))
    return "\n".join(lines) + "\n"
