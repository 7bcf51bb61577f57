"""Benchmark: where a routed request's time goes, by Envoy's own clock.

    python -m benchmarks.ext_proc_breakdown [--write] [--requests 400]

`sluicegate up` serves a routing-only document (no tenants) in front of a mock provider;
its Envoy config (from the admin config dump: listener, routes, clusters, endpoints) is
then replayed as a static bootstrap, with one change: an access log that writes Envoy's
timeline of each request in microseconds (`%COMMON_DURATION(DS_RX_BEG:...:us)%`). Two
static Envoys run it, one worker each, against the same mock provider and one ext_proc
server process (`ExtProcServer`, uvloop, as `sluicegate ext-proc` serves it):

- routing: the config as served;
- plain: the same with the ext_proc filter removed and the routes matching without the
  model header (what Envoy alone costs).

Requests are sent one at a time (a 16-token non-streamed completion the mock answers at
once). Reported: the median of each timeline point, from the first request byte Envoy
read, and the client's own p50, per gateway, rounds alternating.
"""

from __future__ import annotations

import asyncio
import copy
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import aiohttp

from benchmarks.admission_path import CHAT, HEADERS, INSTANT, MODEL, start_mock, up_doc
from benchmarks.admission_stack import get_json
from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.ext_proc_child import ExtProcChild
from benchmarks.harness.results import machine, today
from benchmarks.harness.stack import MockProvider, UpStack, probe_headers
from benchmarks.harness.stats import median
from sluicegate import wire
from sluicegate.envoy import EnvoyProcess
from sluicegate.filters import ExtProcServer, RouteInfo, RoutingTable

# Envoy's timeline points (COMMON_DURATION), each measured from DS_RX_BEG.
POINTS: Final = (
    ("DS_RX_END", "request read from the client"),
    ("US_TX_BEG", "first byte sent to the provider"),
    ("US_RX_BEG", "first byte of the provider's answer"),
    ("US_RX_END", "provider's answer read"),
    ("DS_TX_END", "answer written to the client"),
)
LOG_FORMAT: Final = (
    " ".join(f"%COMMON_DURATION(DS_RX_BEG:{point}:us)%" for point, _ in POINTS) + "\n"
)
HCM: Final = "envoy.filters.network.http_connection_manager"
EXT_PROC: Final = "envoy.filters.http.ext_proc"


# ----- the static replay of a served config ----------------------------------------------------


def _of_type(dump: dict[str, Any], name: str) -> dict[str, Any]:
    section: dict[str, Any] = next(c for c in dump["configs"] if c["@type"].endswith("." + name))
    return section


def _untyped(message: dict[str, Any]) -> dict[str, Any]:
    """A config-dump entry as a bootstrap field: without its `@type`."""
    copied = copy.deepcopy(message)
    copied.pop("@type", None)
    return copied


def static_bootstrap(
    dump: dict[str, Any], ext_proc_port: int, log_path: Path, plain: bool
) -> dict[str, Any]:
    """The served listener, routes and clusters as static resources, with an access log;
    `plain`: without the ext_proc filter, routes matching on the path alone."""
    listener = _untyped(
        _of_type(dump, "ListenersConfigDump")["dynamic_listeners"][0]["active_state"]["listener"]
    )
    listener["address"]["socket_address"]["port_value"] = 0
    routes = _untyped(
        _of_type(dump, "RoutesConfigDump")["dynamic_route_configs"][0]["route_config"]
    )
    hcm = next(f for f in listener["filter_chains"][0]["filters"] if f["name"] == HCM)
    config = hcm["typed_config"]
    del config["rds"]
    config["route_config"] = routes
    config["access_log"] = [
        {
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3."
                "FileAccessLog",
                "path": str(log_path),
                "log_format": {"text_format_source": {"inline_string": LOG_FORMAT}},
            },
        }
    ]
    if plain:
        config["http_filters"] = [f for f in config["http_filters"] if f["name"] != EXT_PROC]
        for host in routes["virtual_hosts"]:
            for route in host["routes"]:
                route.get("match", {}).pop("headers", None)
    endpoints = {
        entry["endpoint_config"]["cluster_name"]: _untyped(entry["endpoint_config"])
        for entry in _of_type(dump, "EndpointsConfigDump").get("dynamic_endpoint_configs", [])
    }
    clusters = []
    for entry in _of_type(dump, "ClustersConfigDump")["dynamic_active_clusters"]:
        cluster = _untyped(entry["cluster"])
        if cluster.get("type") == "EDS":
            cluster["type"] = "STATIC"
            del cluster["eds_cluster_config"]
            cluster["load_assignment"] = endpoints[cluster["name"]]
            cluster["load_assignment"].pop("policy", None)
        clusters.append(cluster)
    for entry in _of_type(dump, "ClustersConfigDump")["static_clusters"]:
        cluster = _untyped(entry["cluster"])
        if cluster["name"] in (wire.EXT_PROC_CLUSTER, wire.EXT_PROC_SIDE_CLUSTER):
            lb = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
            cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = lb[:1]
            lb[0]["endpoint"]["address"]["socket_address"]["port_value"] = ext_proc_port
            clusters.append(cluster)
    any_address = {"socket_address": {"address": "127.0.0.1", "port_value": 0}}
    return {
        "admin": {"address": any_address},
        "static_resources": {"listeners": [listener], "clusters": clusters},
    }


def served_config(work: Path, mock: MockProvider) -> dict[str, Any]:
    """The config dump of `sluicegate up` serving the routing-only document."""
    stack = UpStack(work / "served", up_doc("routing", mock.port))
    try:
        stack.wait_serving(MODEL, probe_headers("unused"))
        dump: dict[str, Any] = get_json(stack.admin + "/config_dump?include_eds")
        return dump
    finally:
        stack.stop()


def build_server() -> ExtProcServer:
    """The ext_proc server (in its own process), routing `MODEL` to route `chat`."""
    return ExtProcServer(RoutingTable({MODEL: RouteInfo("chat")}))


# ----- the measurement -------------------------------------------------------------------------


async def _sequential(url: str, count: int) -> list[float]:
    latencies = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            started = time.perf_counter()
            async with session.post(url, data=CHAT, headers={**HEADERS, **INSTANT}) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url}: HTTP {response.status}")
            latencies.append(time.perf_counter() - started)
    return latencies


def _timelines(path: Path, skip: int) -> list[list[int]]:
    rows = []
    for line in path.read_text().splitlines()[skip:]:
        fields = line.split()
        if len(fields) == len(POINTS) and all(f.isdigit() for f in fields):
            rows.append([int(f) for f in fields])
    return rows


def measure(
    dump: dict[str, Any], ext_proc_port: int, work: Path, rounds: int, requests: int
) -> dict[str, tuple[list[list[int]], list[float]]]:
    found: dict[str, tuple[list[list[int]], list[float]]] = {}
    variants: list[tuple[str, bool]] = [("plain", True), ("routing", False)]
    for index in range(rounds):
        for name, plain in variants if index % 2 == 0 else variants[::-1]:
            log = work / f"{name}-{index}.log"
            config = static_bootstrap(dump, ext_proc_port, log, plain)
            with EnvoyProcess(config, work_dir=work / f"{name}-{index}", concurrency=1) as envoy:
                host, port = next(iter(envoy.listeners().values()))
                url = f"http://{host}:{port}/v1/chat/completions"
                warm = 50
                latencies = asyncio.run(_sequential(url, warm + requests))[warm:]
            rows, client = found.setdefault(name, ([], []))
            rows += _timelines(log, warm)
            client += latencies
            print(f"round {index + 1} {name}: client p50 {median(latencies) * 1e3:.2f} ms")
    return found


def report(found: dict[str, tuple[list[list[int]], list[float]]], command: str, head: str) -> str:
    out = [f"`{command}` — {head}", "", (__doc__ or "").split("\n\n", 2)[2].strip(), ""]
    out += [
        "| Envoy's timeline, µs from the first request byte (median) | plain Envoy | "
        "with the routing stage | difference |",
        "|---|---:|---:|---:|",
    ]
    medians: dict[str, list[float]] = {
        name: [median([row[i] for row in rows]) for i in range(len(POINTS))]
        for name, (rows, _) in found.items()
    }
    for i, (_, label) in enumerate(POINTS):
        plain, routing = medians["plain"][i], medians["routing"][i]
        out.append(f"| {label} | {plain:.0f} | {routing:.0f} | {routing - plain:+.0f} |")
    client = {name: median(latencies) * 1e6 for name, (_, latencies) in found.items()}
    out.append(
        f"| the client's whole request (its p50) | {client['plain']:.0f} | "
        f"{client['routing']:.0f} | {client['routing'] - client['plain']:+.0f} |"
    )
    alone, routed = medians["plain"], medians["routing"]
    stream_start = routed[0] - alone[0]
    round_trips = (routed[1] - routed[0]) - (alone[1] - alone[0])
    provider = (routed[2] - routed[1]) - (alone[2] - alone[1])
    outside = (client["routing"] - client["plain"]) - (routed[-1] - alone[-1])
    out += ["", "### Reading", ""]
    out.append(
        f"- **Envoy opening the ext_proc stream** (the headers message sent before the body "
        f"is read): {stream_start:+.0f} µs before the request is read."
    )
    out.append(
        f"- **The two round trips to the Python server** (headers answer, then the buffered "
        f"body and its answer), from the request read to the first byte sent to the "
        f"provider: {round_trips:+.0f} µs over plain Envoy. The stage's own work is tens of "
        "µs per request (section Admission, 'Where the time goes': whole stage, routing "
        "only); the rest is gRPC between Envoy and grpc.aio."
    )
    out.append(
        f"- **The provider answers {provider:+.0f} µs later** than behind plain Envoy (its "
        "first byte after the request went out), although it gets the same request: most "
        "likely the ext_proc server still finishing its answer on the same 2 cores."
    )
    out.append(
        f"- **Outside Envoy's timeline: {outside:+.0f} µs** (the client's difference minus "
        "Envoy's): the client waiting for Envoy to start reading its request or for the "
        "answer to reach it, on cores the other processes share."
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=400, help="requests per round")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluicegate-breakdown-") as tmp:
        work = Path(tmp)
        mock = start_mock(work)
        server = ExtProcChild(build_server)  # boots while `up` serves the config to dump
        try:
            dump = served_config(work, mock)
            server.wait_ready(20)
            found = measure(dump, server.port, work, args.rounds, args.requests)
        finally:
            server.stop()
            mock.stop(grace_s=5)
    command = command_line("benchmarks.ext_proc_breakdown", argv)
    head = (
        f"{today()}; {machine()}; Envoy with 1 worker; whole run "
        f"{time.monotonic() - started:.0f} s; load average (1 min) {os.getloadavg()[0]:.1f} "
        "at the end."
    )
    record("Where a routed request's time goes", report(found, command, head), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
