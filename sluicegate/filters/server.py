"""ExtProcServer: the grpc.aio server that Envoy's ext_proc filters call."""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Final

import grpc

from sluicegate.model import Gateway
from sluicegate.records import RecordSink

from .admission import AdmissionController, AdmissionPolicy, admission_policy
from .counters import Counters
from .service import ExtProcService
from .table import RoutingTable

log = logging.getLogger("sluicegate.filters")

# Bodies up to the configured 64 MiB limit, plus room for the envelope.
DEFAULT_MAX_MESSAGE_BYTES: Final = 72 * 1024 * 1024

_SERVER_OPTIONS: Final = (
    # Never share a port silently with another process (gRPC's default is on).
    ("grpc.so_reuseport", 0),
    # Envoy's HTTP/2 keepalive pings an idle connection; do not answer with GOAWAY.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
)


class ExtProcServer:
    """Serves ExternalProcessor.Process on one address.

    `start` must run inside the event loop that will serve (uvloop or asyncio).
    """

    def __init__(
        self,
        table: RoutingTable | None = None,
        *,
        counters: Counters | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        control_plane: str | None = None,
    ) -> None:
        self.service = ExtProcService(table, counters, AdmissionController())
        # Where usage notes go, if not the config's own control plane (Gateway.control_plane).
        self._control_plane = control_plane
        self._max_message_bytes = max_message_bytes
        self._server: grpc.aio.Server | None = None
        self._address: str | None = None

    @property
    def table(self) -> RoutingTable:
        return self.service.table

    @property
    def counters(self) -> Counters:
        return self.service.counters

    def update_table(self, table: RoutingTable) -> None:
        """Atomically replace the served-model table (hot reload)."""
        self.service.update_table(table)

    def load(self, gateway: Gateway) -> None:
        """Adopt a resolved config (hot reload): both are built before either is swapped,
        then admission policy first, so a model the table routes is known to admission."""
        policy, table = admission_policy(gateway), RoutingTable.from_model(gateway)
        self.update_admission(policy)
        self.update_table(table)
        self.service.load_lanes(gateway, self._control_plane)
        # Metric labels follow the new names (docs/metrics.md, "Cardinality"), and records
        # go to the new access log. One that cannot be opened (validation only warns about
        # a missing directory) is logged, and the last one stays: never a crash.
        try:
            self.service.records.load(gateway)
        except OSError as err:
            log.error("access_log %s cannot be opened (%s); the previous one stays",
                      gateway.access_log, err)  # fmt: skip

    @property
    def records(self) -> RecordSink:
        """Where Envoy's request records go: metrics, and the access log when set."""
        return self.service.records

    @property
    def admission(self) -> AdmissionController:
        return self.service.admission

    def update_admission(self, policy: AdmissionPolicy) -> None:
        """Adopt reloaded tenants, limits and gates (hot reload)."""
        self.service.admission.update(policy)

    @property
    def address(self) -> str:
        """`host:port` actually bound (port resolved when started with port 0)."""
        if self._address is None:
            raise RuntimeError("ExtProcServer is not started")
        return self._address

    async def start(self, address: str = "127.0.0.1:0") -> str:
        """Bind and start serving; returns the bound `host:port`."""
        if self._server is not None:
            raise RuntimeError("ExtProcServer already started")
        host, sep, port_text = address.rpartition(":")
        if not sep or not host or not port_text.isdigit():
            raise ValueError(f"ext_proc address must be host:port, got {address!r}")
        options = (
            *_SERVER_OPTIONS,
            ("grpc.max_receive_message_length", self._max_message_bytes),
            ("grpc.max_send_message_length", self._max_message_bytes),
        )
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers(
            (
                self.service.generic_handler(),
                self.service.records_handler(),
            )
        )
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"ext_proc server cannot bind {address}: {exc}") from None
        await server.start()
        self._server = server
        self._address = f"{host}:{port}"
        return self._address

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop accepting calls; give in-flight streams `grace` seconds."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
            await self.service.lane_notes.close()
            await self.service.admission.close()
            self.service.records.close()

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def __aenter__(self) -> ExtProcServer:
        if self._server is None:
            await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
