"""A request's record charges its reservation: records as Envoy's OpenTelemetry access log
sends them reconcile the reservations made at admission, in a real MemoryStore, by the
rule the observer follows (charge.py); and the ext_proc server takes them over a real
gRPC LogsService call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from sluicegate import wire
from sluicegate.filters import ExtProcServer
from sluicegate.filters.admission import AdmissionController, charge_record
from sluicegate.records import decode
from sluicegate.testing import metadata_fields, usage_fields

from ..records.helpers import export_of, log_record
from .admission_helpers import settle, wait_until
from .helpers import CHANNEL_OPTIONS
from .test_usage_stream import ESTIMATE, LIMITS, RESERVATION, charged, reports, tokens


def attributes_of(
    *,
    status: int = 200,
    reservation: str | None = RESERVATION,
    usage: dict[str, Any] | None = None,
    stream: bool = False,
    by_observer: bool = False,
) -> dict[str, str]:
    """A finished request as its record carries it (values as Envoy formats them)."""
    meta: dict[str, Any] = {
        wire.META_TENANT: "acme",
        wire.META_MODEL: "gpt-4o",
        wire.META_STREAM: "true" if stream else "false",
        wire.META_ESTIMATE_INPUT: str(ESTIMATE.input_tokens),
        wire.META_ESTIMATE_OUTPUT: str(ESTIMATE.output_tokens),
    }
    if reservation is not None:
        meta[wire.META_RESERVATION] = reservation
    if by_observer:
        meta[wire.META_USAGE_VIA] = wire.USAGE_VIA_OBSERVER
    attributes = {wire.RECORD_STATUS: str(status), **metadata_fields(meta)}
    if usage is not None:
        attributes.update(usage_fields(usage))
    return attributes


@pytest.fixture
async def admission() -> AsyncIterator[AdmissionController]:
    """A controller (memory store) holding RESERVATION's estimate."""
    held = AdmissionController()
    await held.store().reserve(RESERVATION, LIMITS, ESTIMATE)
    yield held
    await held.close()


async def charge(controller: AdmissionController, **record: Any) -> str | None:
    source = charge_record(controller, decode(log_record(attributes_of(**record)), {}))
    await settle()
    return source


async def test_usage_members_reconcile_to_the_provider_numbers(
    admission: AdmissionController,
) -> None:
    usage = {"prompt_tokens": 12.0, "completion_tokens": 7.0}  # Envoy's doubles
    assert await charge(admission, usage=usage) == "provider"
    assert await charged(admission.store()) == (19, 12, 7)
    assert reports(admission, "provider") == 1
    assert tokens(admission) == (12, 7, 240 - 19)


async def test_responses_api_members_count_too(admission: AdmissionController) -> None:
    await charge(admission, usage={"input_tokens": 5, "output_tokens": 9}, stream=True)
    assert await charged(admission.store()) == (14, 5, 9)


async def test_members_that_are_not_whole_numbers_in_range_are_not_usage(
    admission: AdmissionController,
) -> None:
    """As the body parser: a fraction, a boolean, a negative, a count above
    wire.MAX_USAGE_TOKENS or text that is no number is no count, so the estimate stays
    charged. (Text that is a number, "12", counts: Envoy writes a text member as it is,
    so the record cannot tell it from one: docs/metrics.md, "The record".)"""
    for bad in ("twelve", 12.5, True, -3, 2e9, " 12", "0x0c"):
        await admission.store().reserve(f"r-{bad}", LIMITS, ESTIMATE)
        usage = {"prompt_tokens": bad, "completion_tokens": 1}
        assert await charge(admission, reservation=f"r-{bad}", usage=usage) == "estimate"
    assert reports(admission, "provider") == 0
    await admission.store().reserve("r-text", LIMITS, ESTIMATE)
    usage = {"prompt_tokens": "12", "completion_tokens": 1}
    assert await charge(admission, reservation="r-text", usage=usage) == "provider"


async def test_an_answer_without_usage_keeps_the_estimate(admission: AdmissionController) -> None:
    await charge(admission)
    assert await charged(admission.store()) == (240, 40, 200)
    assert reports(admission, "estimate") == 1


async def test_a_stream_without_usage_is_charged_its_counted_events(
    admission: AdmissionController,
) -> None:
    """Cut by the client or the provider: the prompt estimate and Envoy's count."""
    usage = {wire.USAGE_CONTENT_EVENTS: 3.0}
    assert await charge(admission, usage=usage, stream=True) == "counted"
    assert await charged(admission.store()) == (43, 40, 3)


async def test_a_stream_envoy_did_not_count_keeps_the_estimate(
    admission: AdmissionController,
) -> None:
    """Not an event stream after all (no count, no usage): nothing better is known."""
    assert await charge(admission, stream=True) == "estimate"
    assert await charged(admission.store()) == (240, 40, 200)


@pytest.mark.parametrize("status", [503, 429, 0])
async def test_an_error_or_no_answer_without_usage_is_refunded(
    admission: AdmissionController, status: int
) -> None:
    assert await charge(admission, status=status, usage={wire.USAGE_CONTENT_EVENTS: 2}) == "error"
    assert await charged(admission.store()) == (0, 0, 0)


async def test_the_observer_s_requests_are_its_own_unless_nothing_was_answered(
    admission: AdmissionController,
) -> None:
    """A large JSON answer is the observer's to charge; one that got no response at all
    reaches no observer, so its record charges it."""
    assert await charge(admission, by_observer=True, usage={"prompt_tokens": 1}) is None
    assert await charged(admission.store()) == (240, 40, 200)
    assert await charge(admission, by_observer=True, status=0) == "error"
    assert await charged(admission.store()) == (0, 0, 0)


async def test_records_without_a_reservation_charge_nothing(
    admission: AdmissionController,
) -> None:
    assert await charge(admission, reservation=None, usage={"prompt_tokens": 1}) is None
    assert charge_record(admission, decode(log_record({}), {})) is None
    assert await charged(admission.store()) == (240, 40, 200)


async def test_the_server_charges_records_it_takes_over_grpc() -> None:
    """LogsService.Export on the ext_proc server, as Envoy calls it: the batch's records
    are counted and charged; one whose reservation is unknown costs only itself."""
    async with ExtProcServer() as server:
        admission = server.admission
        await admission.store().reserve(RESERVATION, LIMITS, ESTIMATE)
        usage = {"prompt_tokens": 3, "completion_tokens": 4}
        export = export_of(
            log_record(attributes_of(reservation="unknown", usage=usage)),
            log_record(attributes_of(usage=usage)),
        )
        async with grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS) as channel:
            call = channel.unary_unary(
                "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
                request_serializer=logs_service_pb2.ExportLogsServiceRequest.SerializeToString,
                response_deserializer=logs_service_pb2.ExportLogsServiceResponse.FromString,
            )
            await call(export)
        await wait_until(lambda: reports(admission, "provider") == 2)
        assert await charged(admission.store()) == (7, 3, 4)
