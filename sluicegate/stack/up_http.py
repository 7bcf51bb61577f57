"""`up`'s endpoint (the config's `sluicegate.http`): the whole stack seen from one place.

`/status` is the control plane's document (config, versions, Envoy nodes and their
NACKs), the main ext_proc server's admission state (gates, queues, limiter store) and
every process `up` runs, with its state; `/metrics` is the control plane's and the main
ext_proc's metrics and `sluicegate_process_up` per process; `/drain/<provider>` is
passed to the control plane. `up` reaches both over Unix sockets in its work directory
(stack/http_site.py). A child that does not answer is shown as such: `/status` still
answers, with the process down, so `sluicegate status` can say which one is. Both
children are asked at once, each for at most 1 s: a hung child costs `/status` 1 s,
well within `sluicegate status`'s 5 s, and never hides the other's answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any, Final

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.config import parse_admin_address
from sluicegate.stack.http_site import serve_app, status_endpoint

_TIMEOUT: Final = aiohttp.ClientTimeout(total=1.0)
NOT_ANSWERING: Final = "not answering"
Processes = Callable[[], list[dict[str, Any]]]


class ChildEndpoint:
    """The private HTTP endpoint of one child (`unix:/path`), asked with a short timeout."""

    def __init__(self, address: str) -> None:
        path = parse_admin_address(address).path
        assert path is not None, "children serve `up` on Unix sockets"
        self.path = path

    async def request(self, method: str, path: str) -> tuple[int, bytes] | None:
        """(status, body), or None when the child does not answer."""
        try:
            connector = aiohttp.UnixConnector(path=self.path)
            async with (
                aiohttp.ClientSession(connector=connector, timeout=_TIMEOUT) as session,
                session.request(method, f"http://child{path}") as response,
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


def make_up_app(
    control_plane: ChildEndpoint, ext_proc: ChildEndpoint, processes: Processes
) -> web.Application:
    registry = CollectorRegistry()
    registry.register(ProcessCollector(processes))

    async def document() -> dict[str, Any]:
        found, admission = await asyncio.gather(
            control_plane.json("/status"), ext_proc.json("/status")
        )
        result: dict[str, Any] = found or {"control_plane": NOT_ANSWERING, "last_reload": None}
        if admission is None:
            result["ext_proc"] = NOT_ANSWERING
        result["admission"] = None if admission is None else admission.get("admission")
        result["processes"] = processes()
        return result

    async def status(_: web.Request) -> web.Response:
        return web.json_response(await document(), dumps=lambda o: json.dumps(o, indent=2))

    async def metrics(_: web.Request) -> web.Response:
        parts = [generate_latest(registry)]
        answers = await asyncio.gather(
            control_plane.request("GET", "/metrics"), ext_proc.request("GET", "/metrics")
        )
        parts += [answer[1] for answer in answers if answer is not None and answer[0] == 200]
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
    address: str, control_plane: ChildEndpoint, ext_proc: ChildEndpoint, processes: Processes
) -> web.AppRunner:
    return await serve_app(make_up_app(control_plane, ext_proc, processes), address)
