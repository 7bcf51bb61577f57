"""The series a /metrics page declares, as Prometheus stores them, and their labels."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

# The series a family of each type is stored as (a counter `x` is `x_total`; a histogram
# `x` is `x_bucket`, `x_sum` and `x_count`); a gauge or untyped family: its name.
_SERIES_OF_TYPE: Final = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count"),
}


@dataclass
class Exposition:
    """Every series name a family declares (with samples or not), and the label names
    each series was seen with."""

    series: set[str] = field(default_factory=set)
    labels: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    @classmethod
    def parse(cls, text: str) -> Exposition:
        found = cls()
        for family in text_string_to_metric_families(text):
            found.series.update(family.name + s for s in _SERIES_OF_TYPE.get(family.type, ("",)))
            for sample in family.samples:
                found.series.add(sample.name)
                found.labels[sample.name].update(sample.labels)
        return found
