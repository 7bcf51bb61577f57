"""The ExternalProcessor.Process handler: one gRPC stream per HTTP request (or attempt).

Registered as a generic handler whose response serializer is the identity:
stage code returns the wire bytes of each ProcessingResponse, most of them
prebuilt. The stage comes from the gRPC initial metadata the filter config
sets (`x-sluicegate-stage: routing | usage | attempt | error_body`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate import wire
from sluicegate.lanes import NoteForwarder, note_of
from sluicegate.model import Gateway
from sluicegate.records import RecordSink, RequestRecord, logs_handler

from . import counters as outcome
from . import errors
from .admission import (
    AdmissionController,
    AdmissionStream,
    UsageStream,
    charge_finished,
    charge_pending,
)
from .attempt import AttemptCaches, AttemptStream
from .counters import Counters
from .error_body import ErrorBodyStream
from .responses import INTERNAL_ERROR, PASS_THROUGH
from .table import RoutingTable

SERVICE_NAME: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD_NAME: Final = "Process"

log = logging.getLogger(__name__)


def _identity(data: bytes) -> bytes:
    return data


def stage_of(metadata: Any) -> str | None:
    """The value of the stage key in a call's initial metadata, if any."""
    for key, value in metadata or ():
        if key == wire.STAGE_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return None


class ExtProcService:
    """Holds the routing table and counters; answers Process streams."""

    def __init__(
        self,
        table: RoutingTable | None = None,
        counters: Counters | None = None,
        admission: AdmissionController | None = None,
    ):
        self._table = table if table is not None else RoutingTable()
        self.counters = counters if counters is not None else Counters()
        self.admission = admission if admission is not None else AdmissionController()
        self._attempt_caches = AttemptCaches()
        # Request records (docs/metrics.md) count into the registry /metrics serves, and
        # charge their reservations, or an auto tenant's fast-lane request into its windows
        # (filters/admission/charge.py).
        admission = self.admission
        # An auto tenant's request's records are noted for the control plane's lane
        # steering too (docs/fast-lane.md, "The auto lane"); load_lanes sends them.
        self.lane_notes = NoteForwarder()
        admission.metrics.registry.register(_NoteCounts(self.lane_notes))
        self.records = RecordSink(
            admission.metrics.registry, on_record=self._on_record, on_batch=self._on_batch
        )

    def _on_record(self, record: RequestRecord) -> None:
        if record.auto_lane:
            note = note_of(record)
            if note is not None:
                self.lane_notes.add(note)
        charge_finished(self.admission, record)

    def _on_batch(self) -> None:
        charge_pending(self.admission)

    def load_lanes(self, gateway: Gateway, control_plane: str | None = None) -> None:
        """Send usage notes, while the gateway has an auto tenant, to `control_plane`, or
        the gateway's own (its `sluicegate.xds`)."""
        steered = any(tenant.auto for tenant in gateway.tenants)
        target = control_plane or gateway.control_plane or None
        self.lane_notes.target(target if steered else None)

    @property
    def table(self) -> RoutingTable:
        return self._table

    def update_table(self, table: RoutingTable) -> None:
        """Swap the routing table; streams pick it up on their next message."""
        self._table = table

    def generic_handler(self) -> grpc.GenericRpcHandler[Any, bytes]:
        handler = grpc.stream_stream_rpc_method_handler(
            self._process,
            request_deserializer=ep.ProcessingRequest.FromString,
            response_serializer=_identity,
        )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {METHOD_NAME: handler})

    def records_handler(self) -> grpc.GenericRpcHandler[Any, bytes]:
        """OpenTelemetry LogsService.Export: every request's record (sluicegate.records)."""
        return logs_handler(self.records)

    async def _process(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, bytes]
    ) -> AsyncIterator[bytes]:
        stage = stage_of(context.invocation_metadata())
        counters = self.counters
        if stage == wire.STAGE_ROUTING:
            stream = AdmissionStream(self.admission, self._table, counters)
            try:
                async for request in requests:
                    try:
                        answer = await stream.on_message(request)
                    except Exception:
                        log.exception("routing stage failed on a message")
                        counters.inc(wire.STAGE_ROUTING, outcome.INTERNAL_ERROR)
                        answer = INTERNAL_ERROR
                    yield answer
                    if stream.waiting:
                        # That answer extended Envoy's timeout; now wait in the gate queue.
                        try:
                            answer = await stream.finish_waiting()
                        except Exception:
                            log.exception("routing stage failed while queued")
                            counters.inc(wire.STAGE_ROUTING, outcome.INTERNAL_ERROR)
                            answer = INTERNAL_ERROR
                        yield answer
            finally:
                # The request ended (response done, client gone, or cancelled while queued).
                stream.close()
        elif stage == wire.STAGE_USAGE:
            # Observability mode: Envoy never waits for (and ignores) answers.
            usage = UsageStream(self.admission)
            try:
                async for request in requests:
                    try:
                        usage.on_message(request)
                    except Exception:
                        log.exception("usage stage failed on a message")
                        counters.inc(wire.STAGE_USAGE, outcome.INTERNAL_ERROR)
                    if usage.done:
                        break  # end the call: Envoy closes rather than resets it
            finally:
                usage.finish()
        elif stage == wire.STAGE_ERROR_BODY:
            wrapper = ErrorBodyStream(counters)
            async for request in requests:
                try:
                    answer = wrapper.on_message(request)
                except Exception:
                    log.exception("error-body stage failed on a message")
                    counters.inc(wire.STAGE_ERROR_BODY, outcome.INTERNAL_ERROR)
                    # The provider's answer passes unchanged rather than becoming a 500.
                    answer = PASS_THROUGH.get(request.WhichOneof("request") or "", b"")
                yield answer
        elif stage == wire.STAGE_ATTEMPT:
            attempt = AttemptStream(self._attempt_caches, counters)
            async for request in requests:
                try:
                    answer = attempt.on_message(request)
                except Exception:
                    log.exception("attempt stage failed on a message")
                    counters.inc(wire.STAGE_ATTEMPT, outcome.INTERNAL_ERROR)
                    answer = INTERNAL_ERROR
                yield answer
        else:
            log.error("ext_proc call with unknown stage %r", stage)
            async for _request in requests:
                counters.inc(str(stage), outcome.UNKNOWN_STAGE)
                yield errors.UNKNOWN_STAGE


class _NoteCounts(Collector):
    """`sluicegate_lane_notes_total{outcome}`: usage notes sent to the control plane, or
    dropped (it took none: docs/fast-lane.md, "The auto lane")."""

    def __init__(self, forwarder: NoteForwarder) -> None:
        self._forwarder = forwarder

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "sluicegate_lane_notes",
            "Usage notes of auto tenants' requests sent to the control plane, or dropped",
            labels=["outcome"],
        )
        family.add_metric(["sent"], self._forwarder.sent)
        family.add_metric(["dropped"], self._forwarder.dropped)
        yield family

