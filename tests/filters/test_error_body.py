"""The error-body stage over a real gRPC stream: a provider's non-JSON error answer
becomes OpenAI's error JSON, status and text kept (issue 9, part 3)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from sluicegate import wire
from sluicegate.filters.error_body import wrapped_body

from .helpers import exchange, set_headers

STAGE = wire.STAGE_ERROR_BODY


def response_headers(status: int, content_type: str | None, *, end: bool = False) -> Any:
    request = ep.ProcessingRequest()
    headers = request.response_headers.headers.headers
    headers.add(key=":status", raw_value=str(status).encode())
    if content_type is not None:
        headers.add(key="content-type", raw_value=content_type.encode())
    headers.add(key="retry-after", raw_value=b"7")
    request.response_headers.end_of_stream = end
    return request


def response_body(body: bytes) -> Any:
    return ep.ProcessingRequest(response_body=ep.HttpBody(body=body, end_of_stream=True))


async def test_a_plain_text_400_is_wrapped_with_its_text(channel: grpc.aio.Channel) -> None:
    text = b'quota "exceeded" \\ try later\n'
    headers_answer, body_answer = await exchange(
        channel, STAGE, response_headers(400, "text/plain"), response_body(text)
    )
    common = headers_answer.response_headers.response
    assert set_headers(common) == {"content-type": b"application/json"}
    assert list(common.header_mutation.remove_headers) == ["content-length"]
    document = json.loads(body_answer.response_body.response.body_mutation.body)
    assert document == {
        "error": {
            "message": 'quota "exceeded" \\ try later',
            "type": "invalid_request_error",
            "param": None,
            "code": "provider_error",
        }
    }


async def test_an_error_without_a_body_gets_one(channel: grpc.aio.Channel) -> None:
    (answer,) = await exchange(channel, STAGE, response_headers(502, None, end=True))
    common = answer.response_headers.response
    assert common.status == ep.CommonResponse.CONTINUE_AND_REPLACE
    error = json.loads(common.body_mutation.body)["error"]
    assert error["type"] == "server_error" and "502" in error["message"]


@pytest.mark.parametrize(
    ("status", "body", "kind", "message"),
    [
        (503, b"<html><h1>503</h1></html>", "server_error", "<html><h1>503</h1></html>"),
        (429, b"\xff\xfe slow down", "invalid_request_error", "\ufffd\ufffd slow down"),
        (500, b"   \n", "server_error", "The provider answered 500 without a message."),
    ],
)
def test_wrapped_bodies_are_openai_errors(
    status: int, body: bytes, kind: str, message: str
) -> None:
    error = json.loads(wrapped_body(status, body))["error"]
    assert error == {"message": message, "type": kind, "param": None, "code": "provider_error"}


def test_a_long_page_is_cut_and_a_mislabelled_openai_error_kept() -> None:
    error = json.loads(wrapped_body(502, b"x" * 100_000))["error"]
    assert len(error["message"]) <= 4097
    openai = b'{"error": {"message": "no", "type": "x", "param": null, "code": "y"}}'
    assert wrapped_body(400, openai) == openai
