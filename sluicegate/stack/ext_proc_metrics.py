"""The ext_proc servers' metrics on `up`'s /metrics, each sample labelled by its server.

Envoy spreads requests, and the batches of request records, over every ext_proc server
(the main one and the replicas), so each counts only its share: requests, tokens, the
latency histograms, the gates' in-flight and queued requests. With replicas, `up`'s
`/metrics` shows every server's samples with the label `ext_proc` (`main`, or the
replica's address), so one scrape of `up` sees the whole gateway, and `sum without
(ext_proc)` adds them up (docs/metrics.md). They are not summed here: a replica that
restarts, or misses a scrape, would make every summed counter drop, which Prometheus
reads as a reset of the whole sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

SERVER_LABEL = "ext_proc"
MAIN_SERVER = "main"  # the label value of the main ext_proc server; a replica's is its address


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def labelled_exposition(expositions: Iterable[tuple[str, bytes]]) -> bytes:
    """One Prometheus text exposition of (server, exposition) pairs: every sample keeps its
    labels and gains SERVER_LABEL=server; families keep the first server's order. An
    exposition that does not parse is left out (a server answering garbage, mid-restart)."""
    families: dict[str, Metric] = {}
    for server, text in expositions:
        try:
            parsed = list(text_string_to_metric_families(text.decode("utf-8")))
        except (ValueError, UnicodeDecodeError):
            continue
        for family in parsed:
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            elif merged.type != family.type:
                continue  # the same name with another type: not the same metric
            merged.samples += [
                Sample(s.name, {**s.labels, SERVER_LABEL: server}, s.value, s.timestamp)
                for s in family.samples
            ]
    registry = CollectorRegistry()
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)
