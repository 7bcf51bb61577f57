"""How often Envoy sends the request records: the OpenTelemetry logger's flush interval.

Not collected by pytest. Run:  python -m benchmarks.record_flush [--seconds S]

One Envoy (one worker) answering every request itself, with the translated record log
sent to a gRPC LogsService here that notes when each Export arrives; a request every
20 ms for S seconds. Two forms of the same logger config: as translated (the transport
settings in `common_config`) and with them as top-level fields (how sluicegate wrote it
before: Envoy 1.40 deprecates `common_config` for those). Reported per form: the Exports
received and the gaps between them (LOG_FLUSH_MS is the interval asked for).
"""

from __future__ import annotations

import itertools
import tempfile
import time
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Any, Final

import grpc
from google.protobuf.json_format import MessageToDict

from sluicegate.envoy import EnvoyProcess
from sluicegate.testing import free_ports
from sluicegate.xds.translate.record_log import LOG_FLUSH_MS, record_access_log

from .harness.bootstraps import cluster, typed
from .harness.cli import benchmark_parser
from .harness.processes import wait_listening
from .harness.results import machine, today
from .harness.stats import median

SINK: Final = "sink"
LOGS_SERVICE: Final = "opentelemetry.proto.collector.logs.v1.LogsService"


def _log(top_level: bool) -> dict[str, Any]:
    log = MessageToDict(record_access_log(), preserving_proto_field_name=True)
    value = log["typed_config"]["value"]
    common = value["common_config"]
    common["grpc_service"]["envoy_grpc"]["cluster_name"] = SINK
    if top_level:
        del value["common_config"], common["transport_api_version"]
        value.update(common)
    return log


def _bootstrap(port: int, sink: int, top_level: bool) -> dict[str, Any]:
    hcm = typed(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix="h", access_log=[_log(top_level)],
        http_filters=[{"name": "envoy.filters.http.router",
                       "typed_config": typed("envoy.extensions.filters.http.router.v3.Router")}],
        route_config={"virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]},
    )  # fmt: skip
    address = {"socket_address": {"address": "127.0.0.1", "port_value": port}}
    chain = {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                          "typed_config": hcm}]}  # fmt: skip
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{"name": "l", "address": address, "filter_chains": [chain]}],
            "clusters": [cluster(SINK, sink, http2=True)],
        },
    }


def _exports(top_level: bool, seconds: float, work: Path) -> list[float]:
    """When each Export arrived, over `seconds` of a request every 20 ms."""
    arrived: list[float] = []

    def export(request: bytes, context: Any) -> bytes:
        arrived.append(time.monotonic())
        return b""

    port, sink = free_ports(2)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    handler = grpc.unary_unary_rpc_method_handler(
        export, request_deserializer=lambda b: b, response_serializer=lambda b: b
    )
    service = grpc.method_handlers_generic_handler(LOGS_SERVICE, {"Export": handler})
    server.add_generic_rpc_handlers([service])
    server.add_insecure_port(f"127.0.0.1:{sink}")
    server.start()
    envoy = EnvoyProcess(_bootstrap(port, sink, top_level), work_dir=work, concurrency=1)
    try:
        envoy.start_blocking()
        wait_listening(port, 30.0)
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()
            time.sleep(0.02)
        time.sleep(1.5)  # the last batch, at either interval
    finally:
        envoy.stop_blocking()
        server.stop(0)
    return arrived


def run(seconds: float) -> str:
    work = Path(tempfile.mkdtemp(prefix="record-flush-"))
    lines = [
        f"{today()}; {machine()}; a request every 20 ms for {seconds:g} s; asked: "
        f"{LOG_FLUSH_MS} ms",
        "",
        "| logger config | Exports | median gap s | gaps s (first 8) |",
        "|---|---:|---:|---|",
    ]
    for name, top_level in (("as translated (common_config)", False),
                            ("top-level fields", True)):  # fmt: skip
        arrived = _exports(top_level, seconds, work / name.split()[0])
        gaps = [b - a for a, b in itertools.pairwise(arrived)]
        middle = median(gaps) if gaps else float("nan")
        shown = ", ".join(f"{gap:.3f}" for gap in gaps[:8])
        lines.append(f"| {name} | {len(arrived)} | {middle:.3f} | {shown} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, write_help=None)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    print(run(args.seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
