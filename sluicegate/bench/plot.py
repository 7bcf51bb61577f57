"""`--plot FILE.png`: TTFT and E2E percentiles over time (and, for a sweep, latency
against load). Needs matplotlib: `pip install 'sluicegate[plot]'`."""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

INSTALL_HINT: Final = "pip install 'sluicegate[plot]'"


def plotting_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(document: Mapping[str, Any], path: str | Path) -> None:
    import matplotlib

    # Its first run logs that it built a font cache: not the bench's output.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")  # files only: never a window
    import matplotlib.pyplot as plt

    sweep = document.get("steps") is not None
    panels = 3 if sweep else 2
    figure, axes = plt.subplots(panels, 1, figsize=(10, 3.4 * panels))
    timeline = document["timeline"]
    for axis, metric in zip(axes[:2], ("ttft", "e2e"), strict=True):
        points = [p for p in timeline["points"] if p[metric] is not None]
        times = [p["t"] for p in points]
        for percentile in ("p50", "p95", "p99"):
            axis.plot(times, [p[metric][percentile] * 1000 for p in points], label=percentile,
                      marker=".")
        axis.set_ylabel(f"{metric.upper()} (ms)")
        axis.set_xlabel(f"time since the warm-up (s), {timeline['bucket_s']:g}s buckets")
        axis.legend(loc="upper left")
        axis.grid(alpha=0.3)
    if sweep:
        _sweep_panel(axes[2], document)
    title = document["parameters"]["url"] + (" (capacity step)" if sweep else "")
    figure.suptitle(f"sluicegate bench: {title}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _sweep_panel(axis: Any, document: Mapping[str, Any]) -> None:
    steps = sorted(document["steps"], key=lambda s: s["load"]["value"])
    loads = [s["load"]["value"] for s in steps]
    for metric in ("ttft", "e2e"):
        for percentile in ("p50", "p95", "p99"):
            values = [
                s[metric][percentile] * 1000 if s[metric][percentile] is not None else math.nan
                for s in steps
            ]
            axis.plot(loads, values, marker="o", label=f"{metric} {percentile}")
    capacity = document["capacity"]
    if capacity and capacity["value"] is not None:
        axis.axvline(capacity["value"], color="grey", linestyle="--", label="capacity")
    axis.set_xlabel(document["capacity"]["unit"])
    axis.set_ylabel("latency (ms)")
    axis.set_yscale("log")
    axis.legend(loc="upper left", fontsize="small", ncol=2)
    axis.grid(alpha=0.3)
