"""`up`'s endpoint (the config's `sluicegate.http`): the whole stack seen from one place.

`/status` is the control plane's document (config, versions, Envoy nodes and their
NACKs), the main ext_proc server's admission state (gates, queues, limiter store) and
every process `up` runs, with its state, and each route's providers as `up`'s own Envoy
holds them (`providers`: hosts, healthy, ejected, weight; stack/provider_health.py), and
how full it holds the gates Envoy enforces (`envoy_gates`; stack/envoy_gates.py);
`/metrics` is the control plane's and the main ext_proc's metrics,
`sluicegate_process_up` per process, the providers' host health and Envoy's gates;
`/drain/<provider>` is passed to the control plane. `up` reaches the two children over
Unix sockets in its work directory (stack/http_site.py), and Envoy at its admin
(`sluicegate.envoy_admin`, TCP or a Unix socket). A child that does not answer is shown
as such: `/status` still answers, with the process down, so `sluicegate status` can say
which one is. All three are asked at once, each for at most 1 s: a hung child costs
`/status` 1 s, well within `sluicegate status`'s 5 s, and never hides another's answer
(Envoy's gate stats are asked once the control plane has named the gates: 1 s more at
most). An Envoy that does not answer leaves the host and gate gauges without samples.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.config import parse_admin_address
from sluicegate.stack.envoy_gates import STATS_PATH, gates_document, gates_metrics, read_stats
from sluicegate.stack.ext_proc_metrics import MAIN_SERVER, labelled_exposition
from sluicegate.stack.http_site import serve_app, status_endpoint
from sluicegate.stack.provider_health import (
    CLUSTERS_PATH,
    RouteHealth,
    health_metrics,
    providers_document,
    read_clusters,
)

_TIMEOUT: Final = aiohttp.ClientTimeout(total=1.0)
NOT_ANSWERING: Final = "not answering"
Processes = Callable[[], list[dict[str, Any]]]


class ChildEndpoint:
    """The HTTP endpoint of one child, asked with a short timeout: `unix:/path` (the
    control plane's and the main ext_proc's, in the work directory) or `host:port`
    (Envoy's admin may be either). Never through a proxy (aiohttp reads no proxy
    settings from the environment unless told to)."""

    def __init__(self, address: str) -> None:
        parsed = parse_admin_address(address)
        self.path = parsed.path
        host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
        self.base_url = "http://child" if parsed.path else f"http://{host}:{parsed.port}"

    def _connector(self) -> aiohttp.BaseConnector:
        if self.path is not None:
            return aiohttp.UnixConnector(path=self.path)
        return aiohttp.TCPConnector()

    async def request(self, method: str, path: str) -> tuple[int, bytes] | None:
        """(status, body), or None when the child does not answer."""
        try:
            async with (
                aiohttp.ClientSession(connector=self._connector(), timeout=_TIMEOUT) as session,
                session.request(method, self.base_url + path) as response,
            ):
                return response.status, await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    async def json(self, path: str) -> dict[str, Any] | None:
        """The JSON object at `path`, or None when the child does not answer one (a
        half-written or garbled answer counts as none)."""
        answer = await self.request("GET", path)
        if answer is None or answer[0] != 200:
            return None
        try:
            document = json.loads(answer[1])
        except ValueError:  # UnicodeDecodeError is one too
            return None
        return document if isinstance(document, dict) else None


class ProcessCollector(Collector):
    """`sluicegate_process_up{kind,name}`: 1 while a process of the stack is up."""

    def __init__(self, processes: Processes) -> None:
        self.processes = processes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "sluicegate_process_up", "1 while the process is up", labels=["kind", "name"]
        )
        for process in self.processes():
            gauge.add_metric([process["kind"], process["name"]], process["state"] == "up")
        yield gauge


async def provider_health(envoy_admin: ChildEndpoint | None) -> RouteHealth | None:
    """Each route's providers as Envoy holds them; None without an Envoy or an answer."""
    if envoy_admin is None:
        return None
    clusters = await envoy_admin.json(CLUSTERS_PATH)
    return None if clusters is None else read_clusters(clusters)


async def _none() -> None:
    return None


def make_up_app(
    control_plane: ChildEndpoint,
    ext_proc: ChildEndpoint,
    processes: Processes,
    envoy_admin: ChildEndpoint | None = None,
    replicas: Mapping[str, ChildEndpoint] | None = None,
) -> web.Application:
    """`envoy_admin`: the admin of `up`'s own Envoy (None when `up` starts none);
    `replicas`: the ext_proc replicas' endpoints by their gRPC address, whose metrics are
    shown with the main server's, each sample labelled by its server
    (ext_proc_metrics.py)."""
    replicas = dict(replicas or {})
    registry = CollectorRegistry()
    registry.register(ProcessCollector(processes))

    async def document() -> dict[str, Any]:
        found, admission, health = await asyncio.gather(
            control_plane.json("/status"), ext_proc.json("/status"), provider_health(envoy_admin)
        )
        result: dict[str, Any] = found or {"control_plane": NOT_ANSWERING, "last_reload": None}
        if admission is None:
            result["ext_proc"] = NOT_ANSWERING
        if envoy_admin is not None and health is None:
            result["envoy"] = NOT_ANSWERING
        result["admission"] = None if admission is None else admission.get("admission")
        result["providers"] = None if health is None else providers_document(health)
        result["envoy_gates"] = await envoy_gates(result.get("envoy_gates"))
        result["processes"] = processes()
        return result

    async def envoy_gates(gates: Any) -> dict[str, Any]:
        """The control plane's Envoy gates, with how full `up`'s Envoy holds them."""
        if not isinstance(gates, Mapping) or not gates:
            return {}
        stats = None if envoy_admin is None else await envoy_admin.json(STATS_PATH)
        return gates_document(gates, None if stats is None else read_stats(stats))

    async def status(_: web.Request) -> web.Response:
        return web.json_response(await document(), dumps=lambda o: json.dumps(o, indent=2))

    async def metrics(_: web.Request) -> web.Response:
        planes, health, plane_status, ext_procs = await asyncio.gather(
            control_plane.request("GET", "/metrics"),
            provider_health(envoy_admin),
            control_plane.json("/status") if envoy_admin is not None else _none(),
            asyncio.gather(
                *(server.request("GET", "/metrics") for server in (ext_proc, *replicas.values()))
            ),
        )
        parts = [generate_latest(registry), health_metrics(health)]
        if plane_status is not None:
            gates = await envoy_gates(plane_status.get("envoy_gates"))
            parts.append(gates_metrics(gates))
        if planes and planes[0] == 200:
            parts.append(planes[1])
        if replicas:  # each server's samples labelled by it (ext_proc_metrics.py)
            names = (MAIN_SERVER, *replicas)
            answered = [
                (name, answer[1])
                for name, answer in zip(names, ext_procs, strict=True)
                if answer and answer[0] == 200
            ]
            parts.append(labelled_exposition(answered))
        elif ext_procs[0] and ext_procs[0][0] == 200:
            parts.append(ext_procs[0][1])
        return web.Response(body=b"".join(parts), content_type="text/plain")

    async def drain(request: web.Request) -> web.Response:
        answer = await control_plane.request(request.method, request.path)
        if answer is None:
            return web.json_response({"error": "the control plane is not answering"}, status=503)
        if answer[0] != 200:
            return web.Response(body=answer[1], status=answer[0], content_type="application/json")
        return web.json_response(await document())

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    return status_endpoint(status=status, metrics=metrics, healthz=healthz, drain=drain)


async def start_up_http(
    address: str,
    control_plane: ChildEndpoint,
    ext_proc: ChildEndpoint,
    processes: Processes,
    envoy_admin: ChildEndpoint | None = None,
    replicas: Mapping[str, ChildEndpoint] | None = None,
) -> web.AppRunner:
    app = make_up_app(control_plane, ext_proc, processes, envoy_admin, replicas)
    return await serve_app(app, address)
