"""OpenTelemetry's LogsService.Export, served on the ext_proc servers' gRPC port (and on
the control plane's, for the latency record log: docs/latency-routing.md).

Envoy's record access log (xds/translate/record_log.py) sends a batch of request records
per flush as one unary call. The venv's opentelemetry-proto ships no gRPC stub, so this
is a generic handler; the answer (ExportLogsServiceResponse) is sent empty: everything
was accepted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Final, Protocol

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from .sink import log_records

LOGS_SERVICE_NAME: Final = "opentelemetry.proto.collector.logs.v1.LogsService"
LOGS_METHOD_NAME: Final = "Export"
# An ExportLogsServiceResponse with no partial_success: its wire form is empty.
_EXPORT_ANSWER: Final = b""
# Records handled between two yields to the event loop: a record costs tens of µs of
# Python, and the routing stage's messages wait while a batch of 100 (about 7 ms) runs.
SLICE: Final = 25

log = logging.getLogger(__name__)


def _identity(data: bytes) -> bytes:
    return data


class RecordBatches(Protocol):
    """What takes a batch's OpenTelemetry LogRecords, a slice at a time: the ext_proc
    servers' RecordSink, or the control plane (ControlPlane.on_records: latency weights
    and auto lanes)."""

    def on_records(self, batch: Sequence[Any]) -> int: ...


def logs_handler(sink: RecordBatches) -> grpc.GenericRpcHandler[Any, bytes]:
    """LogsService.Export, feeding each batch to `sink`."""

    async def export(request: Any, _context: grpc.aio.ServicerContext[Any, bytes]) -> bytes:
        try:
            records = list(log_records(request))
            for start in range(0, len(records), SLICE):
                if start:
                    await asyncio.sleep(0)  # let waiting routing-stage messages run
                sink.on_records(records[start : start + SLICE])
        except Exception:
            # A bug must not make Envoy retry or drop the logger: answer, and say so.
            log.exception("request records failed on a batch")
        return _EXPORT_ANSWER

    handler = grpc.unary_unary_rpc_method_handler(
        export,
        request_deserializer=logs_service_pb2.ExportLogsServiceRequest.FromString,
        response_serializer=_identity,
    )
    return grpc.method_handlers_generic_handler(LOGS_SERVICE_NAME, {LOGS_METHOD_NAME: handler})
