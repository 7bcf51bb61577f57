"""sluicegate's own HTTP endpoint: /metrics (Prometheus), /status (JSON), /healthz.

Read-only views of the control plane; it holds no state of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

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
        "nodes": [s.to_dict() for s in cp.cache.status()],
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
