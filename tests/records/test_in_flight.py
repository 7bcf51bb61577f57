"""Records sent while a request runs (docs/fast-lane.md, "The auto lane"): Envoy logs an
`auto` tenant's request every IN_FLIGHT_FLUSH_MS on the lane log (wire.LANE_LAYOUT, access-
log type wire.LOG_TYPE_IN_FLIGHT), and each record names its request by its stream id, as
the record log's end record does. The sink hands such a record to `on_record` (the
ext_proc server's charge) alone: the request is counted and logged at its end."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from prometheus_client import CollectorRegistry
from xds.type.v3 import typed_struct_pb2

from sluicegate import wire
from sluicegate.records import RecordSink, RequestRecord, decode
from sluicegate.testing import metadata_fields, usage_fields
from sluicegate.xds.translate.record_log import (
    RECORD_FORMATS,
    lane_access_logs,
    record_access_log,
)

from .helpers import export_of, gateway, log_record, streamed

STREAM_ID = "5b1c9f0e-7f3a-4c55-9a43-2f1d8f6e0b21"
LANE_META = {
    wire.META_TENANT: "acme",
    wire.META_KEY_NAME: "ci",
    wire.META_MODEL: "m",
    wire.META_ESTIMATE_INPUT: "20",
    wire.META_ESTIMATE_OUTPUT: "100",
    wire.META_CHARGED_TENANT: "acme",
    wire.META_AUTO_LANE: True,
}


def lane_fields(log_type: str = wire.LOG_TYPE_IN_FLIGHT) -> dict[str, str]:
    """A fast-lane request of an auto tenant still running: no status or usage yet."""
    return {
        wire.RECORD_STREAM_ID: STREAM_ID,
        wire.RECORD_LOG_TYPE: log_type,
        wire.RECORD_STATUS: "0",
        wire.RECORD_CONTENT_TYPE: "-",
        **metadata_fields(LANE_META),
        **usage_fields({}),
    }


def body_record(body: str) -> Any:
    """A log record of this body, as Envoy's OpenTelemetry logger sends it."""
    return logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value=body))


def as_envoy_sends(log: Any, values: dict[str, str]) -> Any:
    """The record `log` (an AccessLog the translator built) sends when Envoy formats each
    field as `values` says (a field not given: "-", Envoy's value for none)."""
    typed = typed_struct_pb2.TypedStruct()
    assert log.typed_config.Unpack(typed)
    body = json_format.MessageToDict(typed.value)["body"]["string_value"]
    for key, envoy_format in RECORD_FORMATS.items():
        body = body.replace(envoy_format, values.get(key, "-"))
    return body_record(body)


def test_a_lane_log_record_sent_while_the_request_runs_decodes_in_flight() -> None:
    record = decode(log_record(lane_fields(), log_name=wire.LANE_LOG_NAME), {})
    assert record.in_flight and record.stream_id == STREAM_ID
    assert (record.tenant, record.key_name, record.model) == ("acme", "ci", "m")
    assert (record.estimate_input, record.estimate_output) == (20, 100)
    assert record.auto_lane and record.fast_lane and not record.reservation
    assert record.input_tokens is None and record.output_tokens is None
    # The same logger's record of the request's end is not in flight.
    ended = decode(log_record(lane_fields("DownstreamEnd"), log_name=wire.LANE_LOG_NAME), {})
    assert not ended.in_flight and ended.stream_id == STREAM_ID


def test_the_lane_log_body_is_read_in_its_own_order() -> None:
    """Written by hand as Envoy sends it (the order of wire.LANE_LAYOUT, the metadata a
    key a line, the model last), not by record_body: a layout that changed on one side
    only shows here."""
    body = "\n".join(
        (
            wire.LANE_LOG_NAME,
            STREAM_ID,
            "DownstreamPeriodic",
            "200",
            "-",
            "text/event-stream",
            # tenant, key name, priority, scenario, scenario asked, route, error code
            *("acme", "ci", "-", "-", "-", "-", "-"),
            # queue ms, stream, reservation, estimates in and out, usage via, auto lane
            *("-", "-", "-", "20", "100", "-", "true"),
            # charged tenant; the usage: prompt, completion, input, output, content events
            *("acme", "-", "-", "-", "-", "-"),
            "m",
        )
    )
    record = decode(body_record(body), {})
    assert record.in_flight and record.stream_id == STREAM_ID
    assert (record.status, record.stream, record.tenant) == (200, True, "acme")
    assert record.auto_lane and record.fast_lane and record.model == "m"
    assert (record.key_name, record.estimate_input, record.estimate_output) == ("ci", 20, 100)


def test_the_record_log_s_end_record_carries_its_stream_id() -> None:
    record = decode(log_record(streamed(**{wire.RECORD_STREAM_ID: STREAM_ID})), {})
    assert record.stream_id == STREAM_ID and not record.in_flight
    assert (record.route, record.provider, record.status) == ("chat", "alpha", 200)
    body = f"{wire.RECORD_LOG_NAME}\n{STREAM_ID}\nchat\nalpha\n200"
    raw = decode(body_record(body), {})
    assert (raw.stream_id, raw.route, raw.provider, raw.status) == (STREAM_ID, "chat", "alpha", 200)
    # A record without an id (an older Envoy's attributes) has none: "" (never "-").
    assert decode(log_record(streamed()), {}).stream_id == ""


def test_what_the_translator_s_loggers_send_decodes_to_the_stream_and_its_type() -> None:
    """The body format each logger of an auto tenant's listener is given, formatted as
    Envoy would: both lane loggers' records (to the control plane, to the ext_proc
    servers) and the record log's carry the stream id; the lane log's its log type. A
    listener without an auto tenant has its record log leave the id out ("-": no worker
    formats what nobody reads)."""
    values = {
        **lane_fields(),
        wire.RECORD_ROUTE: "chat",
        wire.RECORD_STATUS: "200",
    }
    for log in lane_access_logs():
        record = decode(as_envoy_sends(log, values), {})
        assert record.in_flight and record.stream_id == STREAM_ID
        assert record.tenant == "acme" and record.auto_lane
    end = {**values, wire.RECORD_LOG_TYPE: "DownstreamEnd"}
    for in_flight, stream_id in ((False, ""), (True, STREAM_ID)):
        record = decode(as_envoy_sends(record_access_log(in_flight=in_flight), end), {})
        assert record.stream_id == stream_id and not record.in_flight
        assert (record.route, record.status) == ("chat", 200)


class Capture:
    """An access log that keeps what it is given."""

    destination = "capture"

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def write(self, records: Iterable[RequestRecord]) -> None:
        self.records.extend(records)

    def close(self) -> None:
        pass


def requests_total(registry: CollectorRegistry) -> float:
    return sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "sluicegate_requests"
        for sample in metric.samples
        if sample.name == "sluicegate_requests_total"
    )


def test_the_sink_hands_an_in_flight_record_to_the_charge_alone() -> None:
    """Two in-flight records and the end of one request, with another request's end: the
    charge (`on_record`) sees all four; the metrics and the access log see the two ends."""
    registry = CollectorRegistry()
    handled: list[RequestRecord] = []
    sink = RecordSink(registry, on_record=handled.append)
    sink.load(gateway())
    access_log = Capture()
    sink.set_access_log(access_log)
    in_flight = log_record(lane_fields(), log_name=wire.LANE_LOG_NAME)
    sink.on_export(export_of(in_flight, in_flight))
    assert [record.in_flight for record in handled] == [True, True]
    assert requests_total(registry) == 0
    assert access_log.records == []

    end = log_record(streamed(**{wire.RECORD_STREAM_ID: STREAM_ID}))
    sink.on_export(export_of(end, log_record(streamed())))
    assert [record.in_flight for record in handled] == [True, True, False, False]
    assert handled[2].stream_id == STREAM_ID
    assert requests_total(registry) == 2
    assert [record.stream_id for record in access_log.records] == [STREAM_ID, ""]
    sink.close()
