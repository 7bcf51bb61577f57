"""What the routing stage tells the request record (issue 10): on every request it answers
or passes, admitted or refused, with or without admission, its last answer carries the
tenant, key name, model, priority class, scenario, queue time, stream flag and error
code in the dynamic metadata (admission/record.py). Over a real gRPC stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

from sluicegate import wire
from sluicegate.filters import ExtProcServer
from sluicegate.filters.responses import metadata_answer, metadata_field, namespace_struct

from .admission_helpers import (
    HEAD,
    Stream,
    chat_body,
    hashed,
    metadata_of,
    record_of,
    serving,
    wait_until,
)
from .helpers import error_of, routed_model

TEAM = "sk-record-team-0001"
NARROW = "sk-record-narrow-0002"
ROUTES = """\
scenarios: [chat, long-generation]
routes:
  - name: chat
    models: [gpt-4o]
    scenario: chat
    backends: [{provider: alpha}]
  - name: writer
    models: [writer]
    scenario: long-generation
    backends: [{provider: alpha}]
  - name: plain
    models: [plain]
    backends: [{provider: alpha}]
  - name: team-chat
    path_prefix: /team/v1/
    models: [gpt-4o]
    backends: [{provider: beta}]
"""
OPEN = HEAD + ROUTES
ADMISSION = (
    HEAD
    + """\
admission:
  priority_classes:
    - {name: interactive, max_queue: 8, max_wait: 5s}
    - {name: standard, max_queue: 8, max_wait: 50ms}
  default_priority: standard
"""
    + ROUTES.replace(
        "    models: [plain]\n",
        "    models: [plain]\n    concurrency: {max_requests: 1, headroom: 0}\n",
    )
    + f"""\
tenants:
  - name: team
    rate_limits: {{requests: 3, tokens: 1000000, per: 1m}}
    keys: [{{name: team-key, hash: "{hashed(TEAM)}"}}]
  - name: narrow
    priority: interactive
    models: [writer]
    keys: [{{name: narrow-key, hash: "{hashed(NARROW)}"}}]
"""
)


@pytest.fixture
async def open_channel() -> AsyncIterator[grpc.aio.Channel]:
    async with serving(OPEN) as (_, channel):
        yield channel


@pytest.fixture
async def served() -> AsyncIterator[tuple[ExtProcServer, grpc.aio.Channel]]:
    async with serving(ADMISSION) as pair:
        yield pair


async def request(
    channel: grpc.aio.Channel,
    body: bytes | None,
    *,
    key: str | None = None,
    scenario: str | None = None,
    path: str = "/v1/chat/completions",
) -> tuple[Any, Any]:
    """One request's (headers answer, last answer), the stream closed after it."""
    stream = Stream(channel)
    extra = [] if scenario is None else [(wire.SCENARIO_HEADER, scenario)]
    headers = await stream.headers(key, extra, path=path, method="GET" if body is None else "POST")
    last = headers
    if body is not None and headers.WhichOneof("response") != "immediate_response":
        last = await stream.body(body)
    await stream.close()
    return headers, last


# ----- the encoding ------------------------------------------------------------------------


def test_hand_written_metadata_is_what_protobuf_writes() -> None:
    """responses.metadata_fields/metadata_answer put entries together and wrap them by
    hand: that parses back to the Struct protobuf builds, strings and numbers alike."""
    values: dict[str, str | float] = {
        "tenant": "team",
        "model": "модель-1",
        "queue_ms": 12.5,
        "zero": 0,
        "long": "x" * 300,
    }
    fields = b"".join(metadata_field(key, value) for key, value in values.items())
    parsed = ep.ProcessingResponse.FromString(metadata_answer(wire.METADATA_NAMESPACE, fields))
    expected = struct_pb2.Struct()
    inner = expected.fields[wire.METADATA_NAMESPACE].struct_value
    for key, value in values.items():
        if isinstance(value, str):
            inner.fields[key].string_value = value
        else:
            inner.fields[key].number_value = value
    assert parsed == ep.ProcessingResponse(dynamic_metadata=expected)
    text = {"a": "b"}
    strings = b"".join(metadata_field(k, v) for k, v in text.items())
    assert (
        metadata_answer("ns", strings)
        == ep.ProcessingResponse(dynamic_metadata=namespace_struct("ns", text)).SerializeToString()
    )


def test_field_numbers_written_by_hand_match_the_descriptors() -> None:
    numbers = {
        (ep.ProcessingResponse, "dynamic_metadata"): 8,
        (struct_pb2.Struct, "fields"): 1,
        (struct_pb2.Value, "struct_value"): 5,
    }
    for (message, field), number in numbers.items():
        assert message.DESCRIPTOR.fields_by_name[field].number == number, field


# ----- without admission -------------------------------------------------------------------


async def test_open_gateway_routed_request(open_channel: grpc.aio.Channel) -> None:
    headers, answer = await request(open_channel, chat_body("gpt-4o"))
    assert not headers.HasField("dynamic_metadata")  # written once, on the last answer
    assert routed_model(answer) == "gpt-4o"
    assert record_of(answer) == {
        wire.META_TENANT: "anonymous",
        wire.META_MODEL: "gpt-4o",
        wire.META_PRIORITY: "standard",  # the default class: no other without admission
        wire.META_SCENARIO: "chat",
        wire.META_QUEUE_MS: 0,
        wire.META_STREAM: "false",
    }
    _, answer = await request(open_channel, chat_body("plain", stream=True))
    assert record_of(answer)[wire.META_STREAM] == "true"
    assert record_of(answer)[wire.META_SCENARIO] == "default"


async def test_open_gateway_refusals(open_channel: grpc.aio.Channel) -> None:
    _, answer = await request(open_channel, b"not json")
    assert error_of(answer)[0] == 400
    assert record_of(answer) == {
        wire.META_TENANT: "anonymous",
        wire.META_PRIORITY: "none",  # refused before a class applies
        wire.META_SCENARIO: "",
        wire.META_QUEUE_MS: 0,
        wire.META_ERROR_CODE: "invalid_json",
    }
    _, answer = await request(open_channel, chat_body("unknown", stream=True))
    assert error_of(answer)[0] == 404
    record = record_of(answer)
    assert record[wire.META_MODEL] == "unknown"  # as asked
    assert (record[wire.META_SCENARIO], record[wire.META_STREAM]) == ("", "true")
    assert record[wire.META_ERROR_CODE] == "model_not_found"
    # A client's unrouted model is recorded as its 404 shows it: never more than a line.
    _, answer = await request(open_channel, chat_body("m" * 100_000))
    assert record_of(answer)[wire.META_MODEL] == "m" * 200 + "…"
    # JSON may hold a lone surrogate, which UTF-8 (and so protobuf) cannot carry.
    _, answer = await request(open_channel, b'{"model": "a\\ud800b"}')
    assert error_of(answer)[0] == 404
    assert record_of(answer)[wire.META_MODEL] == "a\ufffdb"


async def test_open_gateway_bodiless_and_header_refusals(open_channel: grpc.aio.Channel) -> None:
    _, answer = await request(open_channel, None, path="/v1/models")
    assert answer.WhichOneof("response") == "request_headers"
    assert record_of(answer) == {
        wire.META_TENANT: "anonymous",
        wire.META_PRIORITY: "standard",
        wire.META_SCENARIO: "",
        wire.META_QUEUE_MS: 0,
        wire.META_STREAM: "false",
    }
    # A credential in the query string is removed from the path: the record stays.
    _, answer = await request(open_channel, None, path="/v1/models?api_key=sk-secret")
    assert record_of(answer)[wire.META_STREAM] == "false"
    mutation = answer.request_headers.response.header_mutation
    assert [h.header.raw_value for h in mutation.set_headers] == [b"/v1/models"]
    stream = Stream(open_channel)
    answer = await stream.headers(extra=[(f"x-h{i}", "v") for i in range(120)])
    await stream.close()
    assert error_of(answer)[0] == 431
    assert record_of(answer)[wire.META_ERROR_CODE] == "request_headers_too_large"


@pytest.mark.parametrize(
    ("model", "path", "header", "scenario"),
    [
        ("gpt-4o", "/v1/chat/completions", None, "chat"),  # the route's
        ("gpt-4o", "/v1/chat/completions", "long-generation", "long-generation"),  # declared
        ("gpt-4o", "/v1/chat/completions", " Long-Generation ", "long-generation"),
        ("gpt-4o", "/v1/chat/completions", "nope", "chat"),  # undeclared: ignored
        ("gpt-4o", "/v1/chat/completions", "", "chat"),
        ("gpt-4o", "/v1/chat/completions", "x" * 5000, "chat"),
        ("gpt-4o", "/v1/chat/completions", "default", "default"),  # always declared
        ("plain", "/v1/chat/completions", "chat", "chat"),
        ("gpt-4o", "/team/v1/chat/completions", None, "default"),  # the other route's
    ],
)
async def test_scenario_is_the_routes_or_a_declared_one_the_client_picks(
    open_channel: grpc.aio.Channel, model: str, path: str, header: str | None, scenario: str
) -> None:
    """An observability header never fails a request: anything undeclared is ignored."""
    _, answer = await request(open_channel, chat_body(model), scenario=header, path=path)
    assert routed_model(answer) == model
    assert record_of(answer)[wire.META_SCENARIO] == scenario


async def test_without_declared_scenarios_every_request_is_the_default() -> None:
    text = HEAD + "routes:\n  - {name: r, models: [m], backends: [{provider: alpha}]}\n"
    async with serving(text) as (_, channel):
        _, answer = await request(channel, chat_body("m"), scenario="chat")
        assert record_of(answer)[wire.META_SCENARIO] == "default"


# ----- with admission ----------------------------------------------------------------------


async def test_admitted_request_names_its_key_never_the_key_itself(
    served: tuple[ExtProcServer, grpc.aio.Channel],
) -> None:
    _, channel = served
    _, answer = await request(channel, chat_body("gpt-4o", stream=True), key=TEAM)
    assert routed_model(answer) == "gpt-4o"
    assert record_of(answer) == {
        wire.META_TENANT: "team",
        wire.META_KEY_NAME: "team-key",
        wire.META_MODEL: "gpt-4o",
        wire.META_PRIORITY: "standard",
        wire.META_SCENARIO: "chat",
        wire.META_QUEUE_MS: 0,
        wire.META_STREAM: "true",
    }
    # The reservation rides in the same namespace, for whoever reads the usage.
    assert metadata_of(answer)[wire.META_RESERVATION]
    assert TEAM not in answer.SerializeToString().decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("key", "body", "path", "expected"),
    [
        (None, chat_body("gpt-4o"), "/v1/chat/completions",
         {wire.META_TENANT: "anonymous", wire.META_ERROR_CODE: "missing_api_key",
          wire.META_PRIORITY: "none", wire.META_SCENARIO: ""}),
        ("sk-wrong", chat_body("gpt-4o"), "/v1/chat/completions",
         {wire.META_TENANT: "anonymous", wire.META_ERROR_CODE: "invalid_api_key"}),
        (TEAM, b'{"model": 5}', "/v1/chat/completions",
         {wire.META_TENANT: "team", wire.META_KEY_NAME: "team-key",
          wire.META_ERROR_CODE: "invalid_type", wire.META_SCENARIO: ""}),
        (TEAM, chat_body("unknown"), "/v1/chat/completions",
         {wire.META_MODEL: "unknown", wire.META_ERROR_CODE: "model_not_found",
          wire.META_STREAM: "false", wire.META_SCENARIO: ""}),
        (NARROW, chat_body("gpt-4o"), "/v1/chat/completions",
         {wire.META_TENANT: "narrow", wire.META_KEY_NAME: "narrow-key",
          wire.META_MODEL: "gpt-4o", wire.META_PRIORITY: "interactive",
          wire.META_SCENARIO: "chat", wire.META_ERROR_CODE: "model_not_allowed"}),
        (NARROW, None, "/v1/models/gpt-4o",  # a model it may not use does not exist for it
         {wire.META_TENANT: "narrow", wire.META_ERROR_CODE: "model_not_found",
          wire.META_STREAM: "false", wire.META_SCENARIO: ""}),
    ],
)  # fmt: skip
async def test_refusals_carry_the_record_and_the_error_code(
    served: tuple[ExtProcServer, grpc.aio.Channel],
    key: str | None,
    body: bytes | None,
    path: str,
    expected: dict[str, Any],
) -> None:
    _, channel = served
    _, answer = await request(channel, body, key=key, path=path)
    status, error = error_of(answer)
    record = record_of(answer)
    assert {name: record.get(name) for name in expected} == expected
    assert record[wire.META_ERROR_CODE] == error["code"]
    assert record[wire.META_QUEUE_MS] == 0
    if error["code"] == "model_not_allowed":  # refused after routing: the model's route
        assert record[wire.META_ROUTE] == "chat"
    else:  # refused before a model route was known
        assert wire.META_ROUTE not in record
    if key is None or key == "sk-wrong":
        assert wire.META_KEY_NAME not in record
    assert status >= 400


async def test_tenant_listing_is_recorded_without_an_error(
    served: tuple[ExtProcServer, grpc.aio.Channel],
) -> None:
    _, channel = served
    _, answer = await request(channel, None, key=NARROW, path="/v1/models")
    assert answer.immediate_response.status.code == 200
    record = record_of(answer)
    assert (record[wire.META_TENANT], record[wire.META_PRIORITY]) == ("narrow", "interactive")
    assert wire.META_ERROR_CODE not in record


async def test_bad_priority_and_rate_limit(served: tuple[ExtProcServer, grpc.aio.Channel]) -> None:
    _, channel = served
    stream = Stream(channel)
    await stream.headers(TEAM, [(wire.PRIORITY_HEADER, "urgent")])
    answer = await stream.body(chat_body("writer"))
    await stream.close()
    record = record_of(answer)
    assert (record[wire.META_ERROR_CODE], record[wire.META_PRIORITY]) == (
        "invalid_priority",
        "none",
    )
    assert record[wire.META_SCENARIO] == "long-generation"
    for _ in range(4):  # the tenant may make 3 requests a minute
        _, answer = await request(channel, chat_body("writer"), key=TEAM)
    record = record_of(answer)
    assert record[wire.META_ERROR_CODE] == "rate_limit_exceeded"
    # Refused after routing: Envoy's route is not the model's, so the record names it.
    assert record[wire.META_ROUTE] == "writer"
    assert (record[wire.META_KEY_NAME], record[wire.META_MODEL]) == ("team-key", "writer")
    assert (record[wire.META_PRIORITY], record[wire.META_SCENARIO]) == (
        "standard",
        "long-generation",
    )


async def test_queue_time_of_admitted_and_shed_requests(
    served: tuple[ExtProcServer, grpc.aio.Channel],
) -> None:
    """`plain` has one slot; the standard class waits at most 50 ms for it."""
    server, channel = served
    gate = server.admission.gates["route:plain"]
    holder = Stream(channel)
    await holder.headers(NARROW)  # interactive: waits up to 5 s
    first = await holder.body(chat_body("writer"))  # not gated: the tenant's only model
    assert record_of(first)[wire.META_QUEUE_MS] == 0
    await holder.close()

    holding = Stream(channel)
    await holding.headers(TEAM)
    assert record_of(await holding.body(chat_body("plain")))[wire.META_QUEUE_MS] == 0
    shed = Stream(channel)
    await shed.headers(TEAM)
    answer = await shed.body(chat_body("plain"))  # waits 50 ms, then shed
    await shed.close()
    assert error_of(answer)[0] == 503
    record = record_of(answer)
    assert record[wire.META_ERROR_CODE] == "queue_timeout"
    assert record[wire.META_ROUTE] == "plain"
    assert record[wire.META_QUEUE_MS] > 0
    assert record[wire.META_SCENARIO] == "default"

    waiting = Stream(channel)
    await waiting.headers(TEAM, [(wire.PRIORITY_HEADER, "standard")])
    await waiting.write_body(chat_body("plain"))
    await wait_until(lambda: gate.queued == 1)
    await holding.close()  # frees the slot: the waiting request gets it
    answer = await waiting.read_answer()
    assert routed_model(answer) == "plain"
    assert record_of(answer)[wire.META_QUEUE_MS] > 0
    await waiting.close()
    await asyncio.sleep(0)


async def test_usage_readers_still_find_the_reservation(
    served: tuple[ExtProcServer, grpc.aio.Channel],
) -> None:
    """charge.reserved_from reads tenant, model and reservation from the same namespace."""
    from sluicegate.filters.admission.charge import reserved_from

    _, channel = served
    _, answer = await request(channel, chat_body("gpt-4o", max_tokens=7), key=TEAM)
    metadata = answer.dynamic_metadata.fields
    filter_metadata = {
        name: value.struct_value for name, value in metadata.items()
    }  # the shape Envoy forwards: namespace -> Struct
    reserved = reserved_from(filter_metadata)
    assert reserved is not None
    assert (reserved.tenant, reserved.model, reserved.estimate.output_tokens) == (
        "team",
        "gpt-4o",
        7,
    )
    assert json.dumps(metadata_of(answer))  # every value a string or a number
