"""Readers of a running stack for benchmarks/admission.py and its parts: JSON from an
admin or mock endpoint, Prometheus samples and histogram quantiles, error codes. The
stacks themselves are started by benchmarks.harness.stack."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def get_json(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def histogram_delta(
    before: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    after: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    labels: Mapping[str, str],
) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) of a histogram's buckets between two scrapes."""
    buckets = []
    for (sample, sample_labels), value in after.items():
        if sample != f"{name}_bucket":
            continue
        as_dict = dict(sample_labels)
        if any(as_dict.get(k) != v for k, v in labels.items()):
            continue
        le = float(as_dict["le"])
        buckets.append((le, value - before.get((sample, sample_labels), 0.0)))
    return sorted(buckets)


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket the rank falls in."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = upper, count
    return lower


def counter_delta(
    before: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    after: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    labels: Mapping[str, str],
) -> float:
    total = 0.0
    for (sample, sample_labels), value in after.items():
        if sample != name:
            continue
        as_dict = dict(sample_labels)
        if any(as_dict.get(k) != v for k, v in labels.items()):
            continue
        total += value - before.get((sample, sample_labels), 0.0)
    return total


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
