"""decode: one log record -> RequestRecord, and never an exception, whatever Envoy sent."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate import wire
from sluicegate.local_replies import (
    FAULT_CODE,
    FAULT_FLAG,
    LOCAL_REPLY_ERRORS,
    OVERLOAD_CODE,
    OVERLOAD_FLAG,
    UPSTREAM_ERRORS,
    LocalReplyError,
    UpstreamError,
)
from sluicegate.records import Declared, decode
from sluicegate.records.record import CLIENT_CLOSED, MAX_TEXT, error_code, status_class
from sluicegate.testing import metadata_fields, usage_fields
from sluicegate.xds.translate.listeners import local_reply_config

from .helpers import STREAMED_META, gateway, log_record, streamed

MAPS = Declared.from_gateway(gateway()).model_maps
KEYS = [
    getattr(wire, name)
    for name in dir(wire)
    if name.startswith("RECORD_") and name != "RECORD_LOG_NAME"
]


def test_a_stream_decodes_every_field() -> None:
    record = decode(log_record(streamed(), time_unix_nano=1_700_000_000_000_000_000), MAPS)
    assert (record.route, record.provider, record.model, record.model_sent) == (
        "chat", "alpha", "m", "m-alpha",
    )  # fmt: skip
    assert (record.tenant, record.key_name, record.priority, record.scenario) == (
        "acme", "ci", "interactive", "default",
    )  # fmt: skip
    assert (record.status, record.status_class, record.error_code) == (200, "2xx", "")
    assert (record.flags, record.code_details, record.attempts) == ("", "via_upstream", 1)
    assert record.stream is True
    assert record.queue_s == 0.0125
    assert record.first_upstream_byte_s == 0.0015
    assert record.ttft_s == 0.3
    assert record.first_downstream_byte_s == 0.0016
    assert record.duration_s == 0.68
    assert record.provider_ttft_s == 0.295  # the attempt out to the first body byte
    assert (record.input_tokens, record.output_tokens) == (7, 20)
    assert record.start_unix_ns == 1_700_000_000_000_000_000


def test_a_provider_without_a_map_is_sent_the_model_asked() -> None:
    record = decode(log_record(streamed(**{wire.RECORD_PROVIDER: "beta"})), MAPS)
    assert record.model_sent == "m"


def test_a_refused_request_has_no_provider_timings_or_usage() -> None:
    # As Envoy 1.40 sent a 401 the routing stage answered (probe, docs/metrics.md).
    attributes = {
        wire.RECORD_ROUTE: "not-found", wire.RECORD_PROVIDER: "-",
        wire.RECORD_STATUS: "401", wire.RECORD_FLAGS: "-",
        wire.RECORD_DETAILS: "sluicegate_invalid_api_key", wire.RECORD_ATTEMPTS: "0",
        wire.RECORD_CONTENT_TYPE: "application/json",
        wire.RECORD_FIRST_UPSTREAM_BYTE_US: "-", wire.RECORD_FIRST_UPSTREAM_BODY_US: "-",
        wire.RECORD_FIRST_DOWNSTREAM_BYTE_US: "3314", wire.RECORD_LAST_DOWNSTREAM_BYTE_US: "3342",
    }  # fmt: skip
    record = decode(log_record(attributes), MAPS)
    # A refused key without a tenant in the metadata (Envoy's key check refuses before
    # anything names one) is the anonymous tenant's in either lane.
    assert (record.provider, record.model_sent, record.tenant) == ("", "", "anonymous")
    assert (record.status_class, record.error_code) == ("4xx", "invalid_api_key")
    fast = {**attributes, wire.RECORD_DETAILS: "unknown_api_key"}
    assert decode(log_record(fast), MAPS).tenant == wire.ANONYMOUS_TENANT
    # A provider's own 401 (routing without Python: no tenant) is nobody's.
    provider = {**attributes, wire.RECORD_DETAILS: "via_upstream", wire.RECORD_PROVIDER: "alpha"}
    assert decode(log_record(provider), MAPS).tenant == ""
    refused = {**attributes, wire.RECORD_STATUS: "429", wire.RECORD_DETAILS: "-"}
    assert decode(log_record(refused), MAPS).tenant == ""
    assert record.attempts == 0
    assert record.ttft_s is None and record.first_upstream_byte_s is None
    assert record.duration_s == 0.003342
    assert record.input_tokens is None and record.output_tokens is None
    assert record.stream is False


def test_nothing_at_all_is_an_empty_record() -> None:
    record = decode(log_record({}), MAPS)
    assert record.route == "" and record.status == 0 and record.status_class == "none"
    assert record.duration_s is None and record.queue_s is None and record.attempts == 0
    assert record.error_code == ""


def test_garbage_numbers_are_none() -> None:
    for bad in ("", "-", "abc", "-5", "1.5", "1e3", " 12", "١٢", "²", "9" * 40):
        record = decode(
            log_record(
                streamed(**{
                    wire.RECORD_STATUS: bad, wire.RECORD_ATTEMPTS: bad,
                    wire.RECORD_LAST_DOWNSTREAM_BYTE_US: bad,
                    wire.RECORD_FIRST_UPSTREAM_BODY_US: bad,
                })
            ),
            MAPS,
        )  # fmt: skip
        assert record.duration_s is None and record.ttft_s is None, bad
        assert record.status == 0 and record.attempts == 0, bad


def test_huge_values_stay_in_range() -> None:
    record = decode(
        log_record(
            streamed(**{
                wire.RECORD_STATUS: "99999",
                wire.RECORD_LAST_DOWNSTREAM_BYTE_US: "999999999999999",
                **usage_fields({"prompt_tokens": 1e300, "completion_tokens": 2**60}),
                **metadata_fields({wire.META_QUEUE_MS: 1e308, wire.META_MODEL: "x" * 10_000}),
            })
        ),
        MAPS,
    )  # fmt: skip
    assert record.status == 0 and record.status_class == "none"
    assert record.duration_s == 999_999_999.999999
    assert record.input_tokens is None and record.output_tokens is None
    assert record.queue_s is None
    assert len(record.model) == MAX_TEXT


def test_odd_metadata_and_usage_are_ignored() -> None:
    """Each value as Envoy would write text a filter put there, or garbage."""
    queue = wire.metadata_field(wire.METADATA_NAMESPACE, wire.META_QUEUE_MS)
    stream = wire.metadata_field(wire.METADATA_NAMESPACE, wire.META_STREAM)
    prompt = wire.metadata_field(wire.USAGE_METADATA_NAMESPACE, "prompt_tokens")
    completion = wire.metadata_field(wire.USAGE_METADATA_NAMESPACE, "completion_tokens")
    for queue_ms, tokens in [
        ("abc", "true"),
        ("-1", "-3"),
        ("NaN", "Infinity"),
        ("inf", "1e"),
        (" 5", "2.5"),
        ("1_000", "0x10"),
        ("[" * 100_000, "9" * 100_000),
        ('{"x":1}', "[7]"),
    ]:
        fields = streamed(**{queue: queue_ms, prompt: tokens, completion: tokens, stream: "yes"})
        record = decode(log_record({**fields, wire.RECORD_CONTENT_TYPE: "-"}), MAPS)
        assert record.queue_s is None, queue_ms
        assert record.input_tokens is None and record.output_tokens is None, tokens
        assert record.stream is False


def test_usage_members_of_the_responses_api_count_too() -> None:
    usage = usage_fields({"input_tokens": 3, "output_tokens": 4})
    record = decode(log_record(streamed(**usage)), MAPS)
    assert (record.input_tokens, record.output_tokens) == (3, 4)


def test_queue_ms_may_be_text() -> None:
    meta = metadata_fields({wire.META_QUEUE_MS: "250"})
    assert decode(log_record(streamed(**meta)), MAPS).queue_s == 0.25


def test_without_the_stream_key_an_event_stream_answer_is_a_stream() -> None:
    meta = metadata_fields({wire.META_MODEL: "m"})
    sse = decode(log_record(streamed(**meta)), MAPS)
    json_answer = decode(
        log_record(streamed(**{**meta, wire.RECORD_CONTENT_TYPE: "application/json"})), MAPS
    )
    assert sse.stream is True and json_answer.stream is False
    said_no = metadata_fields({wire.META_STREAM: False})
    assert decode(log_record(streamed(**said_no)), MAPS).stream is False


def test_status_classes() -> None:
    assert [status_class(s) for s in (0, 99, 100, 204, 399, 404, 503, 599, 600)] == [
        "none", "none", "1xx", "2xx", "3xx", "4xx", "5xx", "5xx", "none",
    ]  # fmt: skip


def test_error_codes() -> None:
    assert error_code("rate_limit_exceeded", 429, "sluicegate_rate_limit_exceeded", "") == (
        "rate_limit_exceeded"
    )
    assert error_code("", 429, "sluicegate_rate_limit_exceeded", "") == "rate_limit_exceeded"
    assert error_code("", 200, "via_upstream", "") == ""
    assert error_code("", 500, "via_upstream", "") == wire.PROVIDER_ERROR
    assert error_code("", 503, "via_upstream", "URX") == wire.PROVIDER_ERROR  # retries ran out
    assert error_code("", 0, "downstream_remote_disconnect", "DC") == CLIENT_CLOSED
    assert error_code("", 0, "", "") == ""
    # Envoy's 500 for an ext_proc failure that is no unavailable server: the table's code.
    assert error_code("", 500, "some_envoy_thing", "") == "internal_error"
    # A status the table does not list gets code null: the record says none either.
    assert error_code("", 426, "low_version", "") == ""


# Envoy's own replies as its access log shows them (status as answered, details, flags)
# and the code local_reply_config gave the client.
@pytest.mark.parametrize(
    ("status", "details", "flags", "code"),
    [
        (504, "upstream_per_try_timeout", "UT,URX", "upstream_timeout"),
        (504, "upstream_per_try_idle_timeout", "UT", "upstream_idle_timeout"),
        (504, "response_timeout", "UT", "deadline_exceeded"),
        (504, "stream_idle_timeout", "SI", "stream_idle_timeout"),
        (503, "upstream_reset_before_response_started{connection_timeout}", "UF,URX",
         "upstream_connect_timeout"),
        (503, "upstream_reset_before_response_started{remote_connection_failure}", "URX,UF",
         "upstream_connect_error"),
        (503, "upstream_reset_before_response_started{overflow}", "UO", "upstream_overflow"),
        (503, "no_healthy_upstream", "UH", "no_healthy_upstream"),
        (503, "upstream_reset_before_response_started{remote_reset}", "UR", "upstream_reset"),
        (503, "upstream_reset_before_response_started{connection_termination}", "UC",
         "upstream_reset"),
        (503, "ext_proc_error_gRPC_error_14{no_healthy_upstream}", "", "ext_proc_unavailable"),
        (503, "ext_proc_error_gRPC_error_13{upstream_reset_after_response_started}", "",
         "ext_proc_unavailable"),
        (503, "overload", "OM", "gateway_overloaded"),
        (429, "fault_filter_abort", "FI", "fault_injected"),
        (404, "route_not_found", "NR", "unknown_url"),
        (404, "direct_response", "", "unknown_url"),
        (400, "http1.codec_error", "DPE", "bad_request"),
        (400, "http1.invalid_transfer_encoding", "DPE", "unsupported_request"),
        (408, "request_overall_timeout", "", "request_timeout"),
        (413, "request_payload_too_large", "", "request_too_large"),
        (431, "http1.headers_too_large", "DPE", "request_headers_too_large"),
        (500, "ext_proc_error_gRPC_error_2{}", "", "internal_error"),
        (502, "upstream_reset_after_response_started{protocol_error}", "UPE", "bad_gateway"),
        (503, "cluster_not_found", "NC", "upstream_unavailable"),
        (503, "cluster_not_found", "URX", "upstream_unavailable"),  # URX is not UR
    ],
)  # fmt: skip
def test_an_envoy_reply_gets_the_code_the_client_got(
    status: int, details: str, flags: str, code: str
) -> None:
    assert error_code("", status, details, flags) == code


def _details_matching(error: UpstreamError) -> str:
    """Details that pass the first of the row's tests, as Envoy writes them."""
    text = ""
    for test in error.details_any[0]:
        if test.op == "equals":
            return test.value
        text = test.value + text if test.op == "starts_with" else text + test.value + "}"
    return text


def _reply_of_row(row: UpstreamError | LocalReplyError) -> tuple[int, str, str]:
    """(status as the record sees it, details, flags) of a reply the row answers."""
    if isinstance(row, UpstreamError):
        if row.details_any:
            return row.status, _details_matching(row), ""
        return row.status, "upstream_reset_before_response_started{x}", f"URX,{row.flags[-1]}"
    if row.answered_as is not None:
        return row.answered_as, row.details[0], ""
    return row.status, "some_local_reply", ""


@pytest.mark.parametrize(
    "row", [*UPSTREAM_ERRORS, *LOCAL_REPLY_ERRORS], ids=lambda row: f"{row.status}-{row.code}"
)
def test_every_row_of_the_local_reply_table_is_the_record_code(
    row: UpstreamError | LocalReplyError,
) -> None:
    status, details, flags = _reply_of_row(row)
    assert error_code("", status, details, flags) == row.code


def test_the_listener_answers_in_the_order_of_the_shared_table() -> None:
    """local_reply_config writes the rows local_reply_code reads, in the same order."""
    mappers = local_reply_config(gateway().limits).mappers
    codes = [m.body_format_override.json_format["error"]["code"] for m in mappers[1:]]
    assert codes == [
        FAULT_CODE, OVERLOAD_CODE, *(e.code for e in UPSTREAM_ERRORS),
        *(e.code for e in LOCAL_REPLY_ERRORS), None,
    ]  # fmt: skip
    assert list(mappers[1].filter.response_flag_filter.flags) == [FAULT_FLAG]
    assert list(mappers[2].filter.response_flag_filter.flags) == [OVERLOAD_FLAG]


texts = st.one_of(
    st.just("-"), st.text(max_size=40), st.text(string.digits, max_size=25),
    st.from_regex(r"\{.*\}", fullmatch=True),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), texts), st.integers(0, 2**64 - 1))
def test_decode_never_raises(attributes: dict[str, str], start: int) -> None:
    record = decode(log_record(attributes, time_unix_nano=start), MAPS)
    assert record.duration_s is None or record.duration_s >= 0
    assert record.input_tokens is None or record.input_tokens >= 0


def test_a_request_refused_after_routing_is_its_model_route_s() -> None:
    """Envoy's route for a request the routing stage refused is not the model's (a
    fallback); the stage names the model route in the metadata (wire.META_ROUTE)."""
    meta = metadata_fields({**STREAMED_META, wire.META_ROUTE: "chat"})
    attributes = streamed(**{wire.RECORD_ROUTE: "fallback-v1", **meta})
    assert decode(log_record(attributes), {}).route == "chat"
    assert decode(log_record(streamed(**{wire.RECORD_ROUTE: "x"})), {}).route == "x"


def test_the_record_body_is_the_log_name_then_one_field_a_line() -> None:
    fields = streamed()
    body = wire.record_body(wire.RECORD_LOG_NAME, fields)
    assert body.split("\n")[0] == wire.RECORD_LOG_NAME
    assert wire.record_fields(body) == {key: fields.get(key, "-") for key in wire.RECORD_LAYOUT}
    # The model, last, keeps whatever it holds; the fields before it stay in place.
    model = wire.metadata_field(wire.METADATA_NAMESPACE, wire.META_MODEL)
    assert wire.RECORD_LAYOUT[-1] == model
    odd = {**fields, model: "a\nb"}
    parsed = wire.record_fields(wire.record_body(wire.RECORD_LOG_NAME, odd))
    assert parsed[model] == "a\nb"
    assert {key: parsed[key] for key in wire.RECORD_LAYOUT[:-1]} == {
        key: fields.get(key, "-") for key in wire.RECORD_LAYOUT[:-1]
    }
    # A provider's usage member as text with a newline garbles that request's usage and
    # model only: who the request was (its tenant, reservation, estimate) stays.
    prompt = wire.metadata_field(wire.USAGE_METADATA_NAMESPACE, "prompt_tokens")
    garbled = decode(log_record({**fields, prompt: "1\n2\n3"}), MAPS)
    whole = decode(log_record(fields), MAPS)
    kept = ("tenant", "key_name", "reservation", "estimate_input", "queue_s", "status", "route")
    assert all(getattr(garbled, name) == getattr(whole, name) for name in kept)
    # The model is none then (a label or charge must not take the provider's text), as it
    # is for a client's model with a newline.
    assert (whole.model, garbled.model) == ("m", "")
    assert decode(log_record(odd), MAPS).model == ""
    # A body of no known log (another logger, an older layout's name) has no fields;
    # a short one has its first fields only.
    assert wire.record_fields("sluicegate-record\n200") == {}  # the layout before 2
    assert wire.record_fields("") == {}
    assert wire.record_fields(f"{wire.RECORD_LOG_NAME}\nid-1\nchat") == {
        wire.RECORD_STREAM_ID: "id-1",
        wire.RECORD_ROUTE: "chat",
    }
    assert decode(log_record({}, log_name=wire.LATENCY_LOG_NAME), MAPS).route == ""


def test_a_record_sent_as_attributes_still_decodes() -> None:
    """An Envoy on the config from before the body (an upgrade under way) sends its fields
    as attributes: those named as today's are read, not lost (its metadata was JSON
    then, and is not read)."""
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.logs.v1 import logs_pb2

    # What such an Envoy sent: the fields of today's names, and the metadata as JSON.
    sent = {key: value for key, value in streamed().items() if ":" not in key}
    sent |= {"metadata": '{"tenant": "acme"}', "usage": '{"completion_tokens": 20}'}
    attributes = [
        common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))
        for key, value in sent.items()
    ]
    record = decode(logs_pb2.LogRecord(attributes=attributes), MAPS)
    assert (record.route, record.provider, record.status) == ("chat", "alpha", 200)
    assert (record.tenant, record.output_tokens) == ("", None)
