"""Lane steering fed the usage notes the ext_proc servers make of Envoy's records of auto
tenants' requests (lanes/notes.py), as OpenTelemetry LogRecords through LogsService's
batches."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from sluicegate import wire
from sluicegate.lanes import LaneSteering
from sluicegate.lanes.notes import note_body, note_of
from sluicegate.records import decode, log_records
from sluicegate.testing import metadata_fields, usage_fields
from tests.latency.helpers import Clock

from .helpers import gateway


def lane_record(
    status: str = "200",
    content_type: str = "application/json",
    metadata: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
) -> Any:
    """The note of a record as Envoy sends it (the LANE layout's fields in the body, "-":
    none), as the ext_proc servers send it on."""
    meta = {
        wire.META_TENANT: "acme",
        wire.META_KEY_NAME: "ci",
        wire.META_MODEL: "m",
        wire.META_AUTO_LANE: True,
        wire.META_ESTIMATE_INPUT: "12",
        wire.META_ESTIMATE_OUTPUT: "900",
        **(metadata or {}),
    }
    fields = {
        wire.RECORD_STATUS: status,
        wire.RECORD_CONTENT_TYPE: content_type,
        **metadata_fields(meta),
        **usage_fields(usage or {}),
    }
    body = wire.record_body(wire.LANE_LOG_NAME, fields)
    record = decode(logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value=body)), {})
    note = note_of(record)
    if note is None:
        return logs_pb2.LogRecord()
    return logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value=note_body(note)))


def batch(*records: Any) -> list[Any]:
    """The LogRecords of one Export call, as records.logs_handler hands them on."""
    export = logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[
            logs_pb2.ResourceLogs(
                instrumentation_library_logs=[logs_pb2.InstrumentationLibraryLogs(logs=records)]
            )
        ]
    )
    return list(
        log_records(
            logs_service_pb2.ExportLogsServiceRequest.FromString(export.SerializeToString())
        )
    )


def test_the_notes_of_the_records_are_counted() -> None:
    steering = LaneSteering(clock=Clock())
    steering.load(gateway())
    counted = steering.on_records(
        batch(
            # A JSON answer with the provider's usage (JSON numbers come as doubles).
            lane_record(usage={"prompt_tokens": 7.0, "completion_tokens": 20.0}),
            # A stream without usage, in the fast lane: its counted events.
            lane_record(
                content_type="text/event-stream",
                metadata={wire.META_STREAM: True},
                usage={wire.USAGE_CONTENT_EVENTS: 5.0},
            ),
            # A refusal (the exact lane's 429) and a provider's error: nothing.
            lane_record(status="429"),
            lane_record(status="503", content_type="application/json"),
            # Another tenant's record, and one that is not a record at all.
            lane_record(metadata={wire.META_TENANT: "fixed"}),
            logs_pb2.LogRecord(),
        )
    )
    assert counted == 2 and steering.records_counted == 2
    report = steering.report()["acme"]
    assert [(u.key, u.kind, u.used) for u in report.limits] == [
        (None, "requests", 2),
        ("ci", "tokens", 7 + 20 + 12 + 5),
    ]


def test_a_batch_past_half_a_limit_moves_the_tenant() -> None:
    steering = LaneSteering(clock=Clock())
    steering.load(gateway())
    big = lane_record(usage={"prompt_tokens": 300.0, "completion_tokens": 200.0})
    assert steering.on_records(batch(big)) == 1
    [move] = steering.tick()
    assert (move.tenant, move.to_lane) == ("acme", "exact")
    assert steering.lanes()["acme"] == "exact"
