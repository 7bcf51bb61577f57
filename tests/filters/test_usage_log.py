"""The usage log: access-log entries of JSON answers reconcile the reservations made at
admission, in a real MemoryStore, by the rule the observer follows (charge.py); and the
ext_proc server takes them over a real gRPC AccessLogService stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.service.accesslog.v3 import als_pb2

from sluicegate import wire
from sluicegate.filters import ExtProcServer
from sluicegate.filters.admission import AdmissionController, UsageLog

from .admission_helpers import settle, wait_until
from .helpers import CHANNEL_OPTIONS
from .test_usage_stream import (
    ESTIMATE,
    LIMITS,
    RESERVATION,
    charged,
    metadata,
    reports,
    tokens,
)


def entry_of(
    message: Any,
    *,
    status: int = 200,
    values: dict[str, str] | None = None,
    usage: dict[str, Any] | None = None,
) -> None:
    """Append one finished request, as Envoy's HTTP gRPC access log describes it."""
    entry = message.http_logs.log_entry.add()
    entry.response.response_code.value = status
    filter_metadata = entry.common_properties.metadata.filter_metadata
    if values is not None:
        namespace = filter_metadata[wire.METADATA_NAMESPACE]
        for key, value in values.items():
            namespace.fields[key].string_value = value
    if usage is not None:
        members = filter_metadata[wire.USAGE_METADATA_NAMESPACE]
        for key, member in usage.items():
            if isinstance(member, bool):
                members.fields[key].bool_value = member
            elif isinstance(member, str):
                members.fields[key].string_value = member
            else:
                members.fields[key].number_value = member


@pytest.fixture
async def admission() -> AsyncIterator[AdmissionController]:
    """A controller (memory store) holding RESERVATION's estimate."""
    held = AdmissionController()
    await held.store().reserve(RESERVATION, LIMITS, ESTIMATE)
    yield held
    await held.close()


async def log(controller: AdmissionController, message: Any) -> int:
    charged_entries = UsageLog(controller).on_message(message)
    await settle()
    return charged_entries


async def test_usage_members_reconcile_to_the_provider_numbers(
    admission: AdmissionController,
) -> None:
    message = als_pb2.StreamAccessLogsMessage()
    entry_of(message, values=metadata(), usage={"prompt_tokens": 12, "completion_tokens": 7})
    assert await log(admission, message) == 1
    assert await charged(admission.store()) == (19, 12, 7)
    assert reports(admission, "provider") == 1
    assert tokens(admission) == (12, 7, 240 - 19)


async def test_responses_api_members_count_too(admission: AdmissionController) -> None:
    message = als_pb2.StreamAccessLogsMessage()
    entry_of(message, values=metadata(), usage={"input_tokens": 5, "output_tokens": 9})
    await log(admission, message)
    assert await charged(admission.store()) == (14, 5, 9)


async def test_members_that_are_not_whole_numbers_in_range_are_not_usage(
    admission: AdmissionController,
) -> None:
    """As the body parser: a string, a fraction, a boolean or a negative is no count, so
    the estimate stays charged."""
    for bad in ("12", 12.5, True, -3, 2e9):
        await admission.store().reserve(f"r-{bad}", LIMITS, ESTIMATE)
        message = als_pb2.StreamAccessLogsMessage()
        values = metadata(reservation=f"r-{bad}")
        entry_of(message, values=values, usage={"prompt_tokens": bad, "completion_tokens": 1})
        await log(admission, message)
    assert reports(admission, "estimate") == 5
    assert reports(admission, "provider") == 0


async def test_an_answer_without_usage_keeps_the_estimate(admission: AdmissionController) -> None:
    message = als_pb2.StreamAccessLogsMessage()
    entry_of(message, values=metadata())
    await log(admission, message)
    assert await charged(admission.store()) == (240, 40, 200)
    assert reports(admission, "estimate") == 1


async def test_an_error_status_without_usage_is_refunded(
    admission: AdmissionController,
) -> None:
    message = als_pb2.StreamAccessLogsMessage()
    entry_of(message, status=503, values=metadata())
    await log(admission, message)
    assert await charged(admission.store()) == (0, 0, 0)
    assert reports(admission, "error") == 1


async def test_entries_without_a_reservation_are_skipped_and_a_batch_is_charged_whole(
    admission: AdmissionController,
) -> None:
    await admission.store().reserve("rid-2", LIMITS, ESTIMATE)
    message = als_pb2.StreamAccessLogsMessage()
    entry_of(message, values=metadata(reservation=None))  # admitted, no limit applied
    entry_of(message)  # no metadata at all
    entry_of(message, values=metadata(), usage={"prompt_tokens": 1, "completion_tokens": 1})
    entry_of(
        message,
        values=metadata(reservation="rid-2"),
        usage={"prompt_tokens": 2, "completion_tokens": 2},
    )
    assert await log(admission, message) == 2
    assert await charged(admission.store()) == (6, 3, 3)


async def test_the_server_takes_entries_over_grpc() -> None:
    """AccessLogService.StreamAccessLogs on the ext_proc server, as Envoy calls it."""
    async with ExtProcServer() as server:
        admission = server.admission
        await admission.store().reserve(RESERVATION, LIMITS, ESTIMATE)
        first = als_pb2.StreamAccessLogsMessage()
        first.identifier.log_name = wire.USAGE_LOG_NAME
        entry_of(first, values=metadata(), usage={"prompt_tokens": 3, "completion_tokens": 4})
        broken = als_pb2.StreamAccessLogsMessage()
        entry_of(broken, values={wire.META_RESERVATION: "unknown"})  # a reservation not here
        async with grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS) as channel:
            call = channel.stream_unary(
                "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs",
                request_serializer=als_pb2.StreamAccessLogsMessage.SerializeToString,
                response_deserializer=als_pb2.StreamAccessLogsResponse.FromString,
            )
            answer = await call(iter([first, broken]))
        assert answer == als_pb2.StreamAccessLogsResponse()
        await wait_until(lambda: reports(admission, "provider") == 1)
        assert await charged(admission.store()) == (7, 3, 4)
