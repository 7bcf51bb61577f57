"""The gRPC AggregatedDiscoveryService and a helper to serve it.

`serve_ads` may serve other gRPC services on the same port (`handlers`): the control
plane adds OpenTelemetry's LogsService, which Envoy's latency record log reaches over the
xDS cluster it already has (docs/latency-routing.md). This room knows nothing of them.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc

from sluicegate.xds.server.cache import SnapshotCache
from sluicegate.xds.server.delta import DeltaStream
from sluicegate.xds.server.sotw import SotwStream

#: A 1,000-route config can pass gRPC's 4 MB default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: How long a push waits for the client's answer before its next phase.
DEFAULT_ACK_TIMEOUT = 10.0

_ports: weakref.WeakKeyDictionary[grpc.aio.Server, int] = weakref.WeakKeyDictionary()


class AdsServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]
    """Serves snapshots from a SnapshotCache over SotW and delta ADS."""

    def __init__(self, cache: SnapshotCache, *, ack_timeout: float = DEFAULT_ACK_TIMEOUT) -> None:
        self.cache = cache
        self.ack_timeout = ack_timeout

    async def StreamAggregatedResources(self, request_iterator: Any, context: Any) -> None:
        """State of the world ADS; `context.read()` is used, not the iterator."""
        await SotwStream(self.cache, context, ack_timeout=self.ack_timeout).run()

    async def DeltaAggregatedResources(self, request_iterator: Any, context: Any) -> None:
        """Incremental ADS."""
        await DeltaStream(self.cache, context, ack_timeout=self.ack_timeout).run()


async def serve_ads(
    cache: SnapshotCache,
    address: str,
    *,
    ack_timeout: float = DEFAULT_ACK_TIMEOUT,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    handlers: Sequence[grpc.GenericRpcHandler[Any, Any]] = (),
) -> grpc.aio.Server:
    """Start an ADS server on `address` ("127.0.0.1:18000"; port 0 picks a free
    one, see `bound_port`) and return it, started, serving `handlers` beside ADS. Stop it
    with `await server.stop(grace)`."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # Envoy keeps one ADS stream open for its lifetime; let idle ones be.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ]
    )
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
        AdsServicer(cache, ack_timeout=ack_timeout), server
    )
    if handlers:
        server.add_generic_rpc_handlers(tuple(handlers))
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind ADS server to {address}")
    await server.start()
    _ports[server] = port
    return server


def bound_port(server: grpc.aio.Server) -> int:
    """The port a server from `serve_ads` listens on."""
    return _ports[server]
