"""`envoy`: plain Envoy with sluicegate's own route, no Python on the path.

The bootstrap is sluicegate's translation of the routing-only document
(`documents.routing_doc`) with everything that needs the ext_proc servers taken
out: the HTTP filters but the router (ext_proc and the usage readers), the access logs
(the request record), the stream twin routes and the model header match (which only the
routing stage could satisfy: the model's route then matches its path prefix alone), and
the ext_proc clusters. What stays is what Envoy itself does for sluicegate per request:
the same route (timeouts, retry policy, host rewrite), the same cluster (pool limits,
outlier detection, the header allowlist), the same listener settings: DOES.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Final

import yaml
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf.message import Message

from sluicegate import wire
from sluicegate.config import load_config
from sluicegate.envoy import EnvoyProcess, find_envoy_binary
from sluicegate.model import build_model
from sluicegate.testing import edited_listeners, free_ports, static_bootstrap
from sluicegate.xds.translate import LISTENER, ROUTE, translate

from .documents import routing_doc
from .peer import RunningPeer, Upstream
from .processes import tree, wait_idle

ROUTER = "envoy.filters.http.router"
DOES: Final = (
    "Envoy's router only: no auth, no limits, no logging, no body buffering; every /v1/ "
    "request goes to the upstream whatever its model (matching the model needs the routing "
    "stage); sluicegate's route, cluster and listener settings otherwise (timeouts, retry "
    "policy, pool limits, outlier detection, the header allowlist)"
)
EXT_PROC_CLUSTERS = frozenset({wire.EXT_PROC_CLUSTER, wire.EXT_PROC_SIDE_CLUSTER})


@cache
def envoy_version() -> str:
    """`Envoy 1.40.0` (the venv's binary; it prints `version: <commit>/1.40.0/Clean/…`)."""
    out = subprocess.run(
        [find_envoy_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"version: \S+?/([^/\s]+)/", out)
    return f"Envoy {found.group(1)}" if found else out.strip()


def _router_only(hcm: hcm_pb2.HttpConnectionManager) -> None:
    hcm.ClearField("access_log")
    kept = [f for f in hcm.http_filters if f.name == ROUTER]
    del hcm.http_filters[:]
    hcm.http_filters.extend(kept)


def _without_routing_stage(config: Message) -> route_pb2.RouteConfiguration:
    """The route configuration with no stream twins and no model header match."""
    assert isinstance(config, route_pb2.RouteConfiguration)
    result = route_pb2.RouteConfiguration()
    result.CopyFrom(config)
    for host in result.virtual_hosts:
        kept = []
        for route in host.routes:
            names = {header.name for header in route.match.headers}
            if wire.STREAM_HEADER in names:
                continue
            if wire.MODEL_HEADER in names:
                others = [h for h in route.match.headers if h.name != wire.MODEL_HEADER]
                del route.match.headers[:]
                route.match.headers.extend(others)
            kept.append(route)
        del host.routes[:]
        host.routes.extend(kept)
    return result


def plain_bootstrap(
    doc: Mapping[str, Any], work: Path, native_module: str | None = None
) -> dict[str, Any]:
    """sluicegate's translation of `doc` (one route, one model) as plain Envoy runs it:
    see the module's docstring. The document is written to work/sluicegate.yaml. With a
    `native_module`, the native library's filters where the translation has them (of
    this edit's, the forwarded headers filter)."""
    path = work / "sluicegate.yaml"
    # The routing stage's routes (on its headers), which this edit then leaves to the
    # router alone: without a lane the default may be Envoy's own routing.
    exact = {**doc, "admission": {**doc.get("admission", {}), "lane": "exact"}}
    path.write_text(yaml.safe_dump(exact, sort_keys=False))
    resources = translate(build_model(load_config(path), {}, native_module=native_module))
    edited = {
        **resources,
        LISTENER: edited_listeners(resources, _router_only),
        ROUTE: [_without_routing_stage(config) for config in resources[ROUTE]],
    }
    bootstrap = static_bootstrap(edited, ext_proc_port=1)  # its clusters are dropped below
    static = bootstrap["static_resources"]
    static["clusters"] = [c for c in static["clusters"] if c["name"] not in EXT_PROC_CLUSTERS]
    if "ExternalProcessor" in json.dumps(static):
        # An attempt stage (per-provider model or path rewrites) would need Python too.
        raise RuntimeError("the route needs an ext_proc stage: not a plain Envoy route")
    return bootstrap


class PlainEnvoy:
    name = "envoy"
    does = DOES

    def __init__(self, work: Path, *, concurrency: int = 1) -> None:
        self.work = work
        self.concurrency = concurrency
        self._runs = itertools.count(1)

    def install(self) -> None:
        pass  # the venv's envoy

    def version(self) -> str:
        return f"{envoy_version()}, --concurrency {self.concurrency}"

    def start(self, upstream: Upstream) -> RunningPeer:
        (port,) = free_ports(1)
        work = self.work / f"{self.name}-{next(self._runs)}"
        work.mkdir(parents=True)
        bootstrap = plain_bootstrap(routing_doc(upstream, port), work)
        envoy = EnvoyProcess(bootstrap, work_dir=work, concurrency=self.concurrency)
        envoy.start_blocking()
        pid = envoy.pid
        assert pid is not None
        try:
            wait_idle(lambda: tree(pid))
        except BaseException:
            envoy.stop_blocking()
            raise

        def stop() -> None:
            envoy.stop_blocking()

        return RunningPeer(self.name, f"http://127.0.0.1:{port}", upstream.model,
                           lambda: tree(pid), stop)  # fmt: skip
