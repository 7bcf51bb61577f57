"""sluicegate's own HTTP endpoint: /metrics (Prometheus), /status (JSON), /healthz.

Read-only views of the control plane; it holds no state of its own. Provider weights per
route (`routing` in /status, `sluicegate_provider_*` gauges) come from the latency router:
every route's configured weights, and on `routing: latency` routes the learned weight and
the smoothed figures it was learned from (docs/latency-routing.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.config import LANE_EXACT, LANE_FAST
from sluicegate.lanes import TenantLane
from sluicegate.latency import ProviderWeight
from sluicegate.stack.control_plane import ControlPlane
from sluicegate.stack.http_site import serve_app, status_endpoint


class ControlPlaneCollector(Collector):
    """Exposes reload and xDS state, computed at scrape time."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.cp = control_plane

    def collect(self) -> Iterator[Any]:
        reloads = CounterMetricFamily(
            "sluicegate_config_reloads", "Config loads by outcome", labels=["outcome"]
        )
        reloads.add_metric(["ok"], self.cp.reloads_ok)
        reloads.add_metric(["rejected"], self.cp.reloads_failed)
        yield reloads
        nodes = GaugeMetricFamily("sluicegate_xds_connected_nodes", "Envoy nodes on ADS streams")
        statuses = self.cp.cache.status()
        nodes.add_metric([], len(statuses))
        yield nodes
        nacks = GaugeMetricFamily(
            "sluicegate_xds_nacked_resources",
            "1 while a node's last answer for a type was a NACK",
            labels=["node", "type"],
        )
        for status in statuses:
            for type_url, nack in status.to_dict().get("nacks", {}).items():
                if nack:
                    nacks.add_metric([status.node_id, type_url.rsplit(".", 1)[-1]], 1)
        yield nacks
        yield from _weight_gauges(self.cp.latency.report())
        yield from _lane_metrics(self.cp.lanes.report())


def _lane_metrics(report: dict[str, TenantLane]) -> Iterator[Any]:
    """Each `auto` tenant's lane (1 for the current one), its moves, and each limit's
    usage as a share of the limit (docs/fast-lane.md, "The auto lane")."""
    lane = GaugeMetricFamily(
        "sluicegate_auto_lane",
        "An auto tenant's current lane (1) and the other (0)",
        labels=["tenant", "lane"],
    )
    moves = CounterMetricFamily(
        "sluicegate_auto_lane_moves", "Moves of an auto tenant between lanes", labels=["tenant"]
    )
    usage = GaugeMetricFamily(
        "sluicegate_auto_lane_usage_ratio",
        "An auto tenant's usage of a limit in its window, as a share of the limit",
        labels=["tenant", "key", "kind"],
    )
    for tenant, state in report.items():
        for name in (LANE_EXACT, LANE_FAST):
            lane.add_metric([tenant, name], 1 if state.lane == name else 0)
        moves.add_metric([tenant], state.moves)
        for limit in state.limits:
            usage.add_metric([tenant, limit.key or "", limit.kind], limit.fraction)
    yield from (lane, moves, usage)


# Gauge name, help, and the ProviderWeight field it shows (None values are left out).
_WEIGHT_GAUGES = (
    ("sluicegate_provider_weight", "A provider's weight in a route, as pushed", "weight"),
    (
        "sluicegate_provider_configured_weight",
        "A provider's weight in a route, as configured",
        "configured_weight",
    ),
    (
        "sluicegate_provider_ttft_smoothed_seconds",
        "A latency route's provider: smoothed time to first token",
        "ttft_s",
    ),
    (
        "sluicegate_provider_tpot_smoothed_seconds",
        "A latency route's provider: smoothed time per output token",
        "tpot_s",
    ),
    (
        "sluicegate_provider_error_rate",
        "A latency route's provider: smoothed share of failed requests",
        "error_rate",
    ),
)


def _weight_gauges(report: dict[str, dict[str, ProviderWeight]]) -> Iterator[GaugeMetricFamily]:
    for name, help_text, attribute in _WEIGHT_GAUGES:
        gauge = GaugeMetricFamily(name, help_text, labels=["route", "provider"])
        for route, providers in report.items():
            for provider, weight in providers.items():
                value = getattr(weight, attribute)
                if value is not None:
                    gauge.add_metric([route, provider], value)
        yield gauge


def routing_document(report: dict[str, dict[str, ProviderWeight]]) -> dict[str, Any]:
    """/status `routing`: route -> provider -> weight, configured_weight, share, ttft_s,
    tpot_s, error_rate, samples (None for what a static route does not learn)."""
    return {
        route: {
            provider: {
                "weight": weight.weight,
                "configured_weight": weight.configured_weight,
                "share": weight.share,
                "ttft_s": _rounded(weight.ttft_s),
                "tpot_s": _rounded(weight.tpot_s),
                "error_rate": _rounded(weight.error_rate),
                "samples": weight.samples,
            }
            for provider, weight in providers.items()
        }
        for route, providers in report.items()
    }


def lanes_document(report: dict[str, TenantLane]) -> dict[str, Any]:
    """/status `lanes`: each `auto` tenant's lane, seconds in it, moves, and each limit's
    usage in its window (`key` null: the tenant's own limit)."""
    return {
        tenant: {
            "lane": state.lane,
            "since_s": round(state.since_s, 3),
            "moves": state.moves,
            "limits": [
                {
                    "key": limit.key,
                    "kind": limit.kind,
                    "limit": limit.limit,
                    "window_s": limit.window_s,
                    "used": limit.used,
                }
                for limit in state.limits
            ],
        }
        for tenant, state in report.items()
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def status_document(cp: ControlPlane) -> dict[str, Any]:
    """The JSON that `sluicegate status` prints."""
    outcome = cp.last_outcome
    return {
        "config_file": str(cp.path),
        "last_reload": None
        if outcome is None
        else {
            "ok": outcome.ok,
            "at": outcome.at,
            "problems": outcome.problems,
            "changed_types": outcome.changed_types,
        },
        "versions": {} if cp.snapshot is None else cp.snapshot.versions(),
        "models": [] if cp.model is None else sorted(cp.model.served),
        "drained": [] if cp.model is None else sorted(cp.model.drained),
        # The native filters library Envoy is told to load (None: Envoy's own, or with
        # `node` each Envoy's own: its node's `class`), why, and the libraries Envoys
        # could not load (stack/native_nodes.py).
        "native_filters": None
        if cp.native is None
        else {
            "setting": cp.native.setting,
            "path": cp.native.path,
            "why": cp.native.why,
            "refused": cp.native_nodes.refused_status(),
        },
        "routing": routing_document(cp.latency.report()),
        "lanes": lanes_document(cp.lanes.report()),
        # Each with the versions of its own view of what it is served (rule 3).
        "nodes": [node.to_dict() for node in cp.cache.status()],
        # The gates Envoy enforces and the limits it was given (`up` adds how full its
        # Envoy holds them: stack/envoy_gates.py).
        "envoy_gates": {}
        if cp.model is None
        else {
            route.name: asdict(route.envoy_gate)
            for route in cp.model.routes
            if route.envoy_gate is not None
        },
    }


def make_app(cp: ControlPlane) -> web.Application:
    """The control plane's endpoint (`up` serves the stack's, stack/up_http.py)."""

    def document() -> dict[str, Any]:
        return status_document(cp)

    registry = CollectorRegistry()
    registry.register(ControlPlaneCollector(cp))

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def status(_: web.Request) -> web.Response:
        return web.json_response(document(), dumps=lambda o: json.dumps(o, indent=2))

    async def drain(request: web.Request) -> web.Response:
        """POST drains a provider, DELETE puts it back; both answer the new status."""
        provider = request.match_info["provider"]
        try:
            cp.set_drained(provider, drained=request.method == "POST")
        except KeyError:
            return web.json_response({"error": f"unknown provider '{provider}'"}, status=404)
        return web.json_response(document())

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok" if cp.config is not None else "no config", status=200)

    return status_endpoint(status=status, metrics=metrics, healthz=healthz, drain=drain)


async def start_status_http(cp: ControlPlane, address: str) -> web.AppRunner:
    """Serve the control plane's endpoint on `host:port` or `unix:/path`."""
    return await serve_app(make_app(cp), address)
