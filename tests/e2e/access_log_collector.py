"""A gRPC AccessLogService in the test process, and a bootstrap edit that makes Envoy
send it every request's entry: what tests read Envoy's dynamic metadata from.

Entries are keyed by RECORD_ID, a request header the header allowlist keeps (a gateway
replaces a client's x-request-id, and the entry shows the request headers as the
allowlist left them: Envoy 1.40's upstream filters change the request's own header map).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
from envoy.service.accesslog.v3 import als_pb2
from google.protobuf import json_format

from sluicegate.testing.bootstraps import grpc_cluster

RECORD_ID: Final = "user-agent"
COLLECTOR_CLUSTER: Final = "record_collector"
HCM_TYPE: Final = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
    "HttpConnectionManager"
)
ALS_TYPE: Final = (
    "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig"
)


@dataclass
class Entry:
    status: int
    details: str
    metadata: dict[str, dict[str, Any]]  # namespace -> its dynamic metadata


@dataclass
class Collector:
    """Keeps each entry by its request's RECORD_ID."""

    entries: dict[str, Entry] = field(default_factory=dict)

    async def stream(self, requests: AsyncIterator[Any], _context: Any) -> bytes:
        async for message in requests:
            for entry in message.http_logs.log_entry:
                request_id = entry.request.request_headers.get(RECORD_ID, "")
                namespaces = entry.common_properties.metadata.filter_metadata
                self.entries[request_id] = Entry(
                    entry.response.response_code.value,
                    entry.response.response_code_details,
                    {name: json_format.MessageToDict(value) for name, value in namespaces.items()},
                )
        return b""

    async def entry(self, request_id: str) -> Entry:
        """The entry of `request_id`, once Envoy has sent it (it batches entries)."""
        deadline = time.monotonic() + 20
        while request_id not in self.entries:
            assert time.monotonic() < deadline, f"no access-log entry for {request_id}"
            await asyncio.sleep(0.02)
        return self.entries[request_id]


async def serve_collector(collector: Collector, port: int) -> grpc.aio.Server:
    """The collector's gRPC server, started on 127.0.0.1:`port`."""
    server = grpc.aio.server()
    handler = grpc.stream_unary_rpc_method_handler(
        collector.stream,
        request_deserializer=als_pb2.StreamAccessLogsMessage.FromString,
        response_serializer=lambda data: data,
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "envoy.service.accesslog.v3.AccessLogService", {"StreamAccessLogs": handler}
            )
        ]
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


def with_access_log(bootstrap: dict[str, Any], collector_port: int) -> dict[str, Any]:
    """The bootstrap with every HCM logging every request to the collector."""
    access_log = {
        "name": "envoy.access_loggers.http_grpc",
        "typed_config": {
            "@type": ALS_TYPE,
            "common_config": {
                "log_name": "request-record-test",
                "grpc_service": {"envoy_grpc": {"cluster_name": COLLECTOR_CLUSTER}},
                "transport_api_version": "V3",
                "buffer_flush_interval": "0.05s",
            },
            "additional_request_headers_to_log": [RECORD_ID],
        },
    }
    resources = bootstrap["static_resources"]
    for listener in resources["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                if network_filter["typed_config"]["@type"] == HCM_TYPE:
                    network_filter["typed_config"].setdefault("access_log", []).append(access_log)
    resources["clusters"].append(grpc_cluster(COLLECTOR_CLUSTER, collector_port))
    return bootstrap
