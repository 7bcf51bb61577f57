"""Attempt stage over a real gRPC stream: per-provider model and path rewrites."""

from __future__ import annotations

import json

import grpc
import pytest

from sluicegate import wire
from sluicegate.filters import ExtProcServer
from sluicegate.filters.attempt import ROUTE_METADATA_ATTRIBUTE

from .helpers import (
    HOST_METADATA_A,
    ROUTE_METADATA_V1,
    body_message,
    error_of,
    exchange,
    headers_message,
    set_headers,
)

ATTEMPT = wire.STAGE_ATTEMPT
HOST = wire.UPSTREAM_HOST_METADATA_ATTRIBUTE
HOST_METADATA_B = (
    'filter_metadata { key: "sluicegate" value { fields { key: "provider" value { '
    'string_value: "b" } } } }'
)
ATTRS_A = {HOST: HOST_METADATA_A, ROUTE_METADATA_ATTRIBUTE: ROUTE_METADATA_V1}
ATTRS_B = {HOST: HOST_METADATA_B, ROUTE_METADATA_ATTRIBUTE: ROUTE_METADATA_V1}


def stored_original_path(answer: object) -> str | None:
    metadata = answer.dynamic_metadata  # type: ignore[attr-defined]
    if wire.METADATA_NAMESPACE not in metadata.fields:
        return None
    return str(
        metadata.fields[wire.METADATA_NAMESPACE].struct_value.fields["original_path"].string_value
    )


async def test_first_attempt_maps_model_and_rewrites_path(
    channel: grpc.aio.Channel, ext_proc: ExtProcServer
):
    body = b'{"model":"m1", "messages": [{"role":"user","content":"h\\u00e9 \xc3\xa9"}],"n":1.50}'
    path = "/v1/chat/completions?x=1"
    headers_answer, body_answer = await exchange(
        channel,
        ATTEMPT,
        headers_message(path, content_length=len(body), attributes=ATTRS_A),
        body_message(body),
    )
    common = headers_answer.request_headers.response
    assert set_headers(common) == {":path": b"/pa/chat/completions?x=1"}
    assert stored_original_path(headers_answer) == path

    common = body_answer.request_body.response
    new_body = common.body_mutation.body
    assert new_body == body.replace(b'"m1"', b'"a-m1"')  # every other byte as sent
    assert set_headers(common) == {"content-length": str(len(new_body)).encode()}
    assert ext_proc.counters.get(ATTEMPT, "rewritten") == 1


async def test_unmapped_model_keeps_body_untouched(channel: grpc.aio.Channel):
    body = b'{"model": "other"}'
    _, answer = await exchange(
        channel,
        ATTEMPT,
        headers_message(content_length=len(body), attributes=ATTRS_A),
        body_message(body),
    )
    common = answer.request_body.response
    assert not common.HasField("body_mutation")
    assert not common.HasField("header_mutation")


async def test_unicode_mapped_model(channel: grpc.aio.Channel):
    text = (
        'filter_metadata { key: "sluicegate" value { fields { key: "model_map" value { '
        'struct_value { fields { key: "модель-1" value { string_value: "模型" } } } } } } }'
    )
    body = json.dumps({"model": "модель-1", "x": "ü"}, ensure_ascii=False).encode()
    _, answer = await exchange(
        channel,
        ATTEMPT,
        headers_message(content_length=len(body), attributes={HOST: text}),
        body_message(body),
    )
    new_body = answer.request_body.response.body_mutation.body
    assert json.loads(new_body) == {"model": "模型", "x": "ü"}
    assert (
        set_headers(answer.request_body.response)["content-length"] == str(len(new_body)).encode()
    )


async def test_retry_to_provider_without_prefix_restores_path_and_length(
    channel: grpc.aio.Channel,
):
    """Attempt 2 sees attempt 1's :path and content-length on the shared header map."""
    body = b'{"model": "m1"}'
    headers_answer, body_answer = await exchange(
        channel,
        ATTEMPT,
        headers_message(
            "/pa/chat/completions",
            content_length=len(body) + 2,
            attributes=ATTRS_B,
            original_path="/v1/chat/completions",
        ),
        body_message(body),
    )
    assert set_headers(headers_answer.request_headers.response) == {
        ":path": b"/v1/chat/completions"
    }
    assert stored_original_path(headers_answer) is None  # already stored by attempt 1
    common = body_answer.request_body.response
    assert not common.HasField("body_mutation")
    assert set_headers(common) == {"content-length": str(len(body)).encode()}


async def test_retry_to_prefixed_provider_uses_the_stored_path(channel: grpc.aio.Channel):
    (headers_answer,) = await exchange(
        channel,
        ATTEMPT,
        headers_message(
            "/elsewhere/chat/completions", attributes=ATTRS_A, original_path="/v1/chat/completions"
        ),
    )
    assert set_headers(headers_answer.request_headers.response) == {
        ":path": b"/pa/chat/completions"
    }


async def test_no_attributes_passes_everything_through(channel: grpc.aio.Channel):
    body = b'{"model": "m1"}'
    headers_answer, body_answer = await exchange(
        channel, ATTEMPT, headers_message(content_length=len(body)), body_message(body)
    )
    assert not headers_answer.request_headers.response.HasField("header_mutation")
    assert not headers_answer.HasField("dynamic_metadata")
    assert not body_answer.request_body.response.HasField("body_mutation")


async def test_bad_metadata_is_500(channel: grpc.aio.Channel, ext_proc: ExtProcServer):
    (answer,) = await exchange(
        channel, ATTEMPT, headers_message(attributes={HOST: "filter_metadata {"})
    )
    status, error = error_of(answer)
    assert (status, error["type"], error["code"]) == (500, "server_error", "bad_provider_metadata")
    assert ext_proc.counters.get(ATTEMPT, "bad_metadata") == 1


@pytest.mark.parametrize(("body", "code"), [(b"nope", "invalid_json"), (b"[]", "invalid_body")])
async def test_unreadable_body_with_a_model_map_is_400(
    channel: grpc.aio.Channel, body: bytes, code: str
):
    _, answer = await exchange(
        channel, ATTEMPT, headers_message(attributes=ATTRS_A), body_message(body)
    )
    status, error = error_of(answer)
    assert (status, error["code"]) == (400, code)


async def test_unreadable_body_without_a_model_map_is_forwarded(channel: grpc.aio.Channel):
    _, answer = await exchange(
        channel, ATTEMPT, headers_message(attributes=ATTRS_B), body_message(b"\xff not json")
    )
    assert answer.WhichOneof("response") == "request_body"
    assert not answer.request_body.response.HasField("body_mutation")
