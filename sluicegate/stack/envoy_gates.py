"""The gates Envoy enforces (model.EnvoyGate; docs/fast-lane.md, "Gates in the fast lane"),
as full as `up`'s Envoy holds them.

The control plane's `/status` names each such gate with the limits it gave Envoy
(`envoy_gates`, per route: `requests`, `pending`, and with two partitions `top_class`,
`top_requests`, `top_pending`). `up` reads how much of each partition its Envoy uses from
the route cluster's `circuit_breakers.{default,high}.remaining_rq` and
`remaining_pending` gauges (kept by `track_remaining`, xds/translate/circuit_breakers.py)
and the requests it refused from `upstream_rq_pending_overflow` and `upstream_rq_overflow`,
and shows them under `envoy_gates` in `/status` and as gauges on `/metrics` (stack/up_http.py).

Envoy's counts are route-wide and per Envoy process: another Envoy on the same control
plane holds gates of its own, which its own admin shows. Right after a reload changes a
gate, the control plane's new limits may meet the counts of the cluster Envoy still holds
(until it takes the new one): the figures are a view, not a check. A partition is `top`
(the top class, `class`, at Envoy's HIGH priority), `rest` (the other classes, DEFAULT),
or `all` (a gate of one partition): fixed names, so no class name can make two series one.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.model import CLUSTER_PREFIX

# The gauges and counters read, of every route cluster (a route's name may hold dots).
_SUFFIXES: Final = {
    "circuit_breakers.high.remaining_rq": ("high", "in_flight"),
    "circuit_breakers.high.remaining_pending": ("high", "waiting"),
    "circuit_breakers.default.remaining_rq": ("default", "in_flight"),
    "circuit_breakers.default.remaining_pending": ("default", "waiting"),
    "upstream_rq_pending_overflow": ("", "refused"),
    "upstream_rq_overflow": ("", "refused"),
}
STATS_PATH: Final = "/stats?format=json&filter=" + urllib.parse.quote(
    rf"^cluster\.{CLUSTER_PREFIX}.+\.(circuit_breakers\.(high|default)\.remaining_(rq|pending)"
    r"|upstream_rq_(pending_)?overflow)$"
)
TOP_PARTITION: Final = "top"
REST_PARTITION: Final = "rest"
WHOLE_GATE: Final = "all"


def read_stats(document: Any) -> dict[str, dict[tuple[str, str], int]]:
    """Route -> (Envoy priority, what) -> value, from `/stats?format=json`; `refused` sums
    both overflow counters. Anything malformed is skipped: this is a view, never a check."""
    found: dict[str, dict[tuple[str, str], int]] = {}
    stats = document.get("stats") if isinstance(document, Mapping) else None
    for stat in stats if isinstance(stats, list) else ():
        name = stat.get("name") if isinstance(stat, Mapping) else None
        value = stat.get("value") if isinstance(stat, Mapping) else None
        if not isinstance(name, str) or not isinstance(value, int) or isinstance(value, bool):
            continue
        prefix = f"cluster.{CLUSTER_PREFIX}"
        for suffix, key in _SUFFIXES.items():
            if name.startswith(prefix) and name.endswith("." + suffix):
                route = name[len(prefix) : -len(suffix) - 1]
                values = found.setdefault(route, {})
                values[key] = values.get(key, 0) + value
    return found


def gates_document(
    gates: Mapping[str, Any], stats: Mapping[str, Mapping[tuple[str, str], int]] | None
) -> dict[str, dict[str, Any]]:
    """`/status` `envoy_gates`: route -> `partitions` (each: `partition`, the top `class`
    or None, Envoy's `priority`, `in_flight` of `max_requests`, `waiting` of
    `max_pending`) and `refused` (since Envoy started). A figure Envoy did not give
    (`stats` None: it did not answer) is None."""
    document = {}
    for route, gate in sorted(gates.items()):
        if not isinstance(gate, Mapping):
            continue
        held = None if stats is None else stats.get(route, {})
        top = gate.get("top_class")
        parts: list[tuple[str, str | None, str, str, str]] = []
        if top:
            parts.append((TOP_PARTITION, str(top), "high", "top_requests", "top_pending"))
        rest = REST_PARTITION if top else WHOLE_GATE
        parts.append((rest, None, "default", "requests", "pending"))
        partitions = []
        for name, klass, priority, requests_key, pending_key in parts:
            most, queue = _int(gate.get(requests_key)), _int(gate.get(pending_key))
            partitions.append(
                {
                    "partition": name,
                    "class": klass,
                    "priority": priority,
                    "in_flight": _used(most, held, (priority, "in_flight")),
                    "max_requests": most,
                    "waiting": _used(queue, held, (priority, "waiting")),
                    "max_pending": queue,
                }
            )
        refused = None if held is None else held.get(("", "refused"))
        document[route] = {"partitions": partitions, "refused": refused}
    return document


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _used(
    limit: int | None, held: Mapping[tuple[str, str], int] | None, key: tuple[str, str]
) -> int | None:
    """The limit less what Envoy says remains (remaining_* gauges count down from it)."""
    if limit is None or held is None or key not in held:
        return None
    return max(0, limit - held[key])


# Gauge name, help, and the partition's field it shows. The names are fixed: deploy/'s
# rules and dashboard may use them.
_GAUGES: Final = (
    ("sluicegate_envoy_gate_in_flight_requests", "Requests in flight at a partition of a "
     "gate Envoy enforces", "in_flight"),
    ("sluicegate_envoy_gate_max_in_flight_requests", "Requests a partition of a gate Envoy "
     "enforces lets in flight", "max_requests"),
    ("sluicegate_envoy_gate_waiting_requests", "Requests waiting in Envoy's queue at a "
     "partition of a gate Envoy enforces", "waiting"),
    ("sluicegate_envoy_gate_max_waiting_requests", "Requests a partition of a gate Envoy "
     "enforces lets wait", "max_pending"),
)  # fmt: skip


class _Reading(Collector):
    def __init__(self, document: Mapping[str, Mapping[str, Any]]) -> None:
        self.document = document

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for name, text, field in _GAUGES:
            gauge = GaugeMetricFamily(name, text, labels=["route", "partition"])
            for route, gate in self.document.items():
                for partition in gate["partitions"]:
                    if partition[field] is not None:
                        gauge.add_metric([route, partition["partition"]], partition[field])
            yield gauge
        refused = CounterMetricFamily(
            "sluicegate_envoy_gate_refused_requests",
            "Requests a gate Envoy enforces refused (its queue full), since Envoy started",
            labels=["route"],
        )
        for route, gate in self.document.items():
            if gate["refused"] is not None:
                refused.add_metric([route], gate["refused"])
        yield refused


def gates_metrics(document: Mapping[str, Mapping[str, Any]]) -> bytes:
    """Prometheus text of one reading (`gates_document`); nothing for no gates."""
    if not document:
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Reading(document))
    return bytes(generate_latest(registry))
