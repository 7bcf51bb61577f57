"""Builders and readers for ext_proc messages, shared by the filter tests."""

from __future__ import annotations

import json
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from sluicegate import wire
from sluicegate.filters import RouteInfo, RoutingTable
from sluicegate.testing import (
    HOST_METADATA_A,
    ROUTE_METADATA_V1,
    body_message,
    headers_message,
)

# The message builders are shared with the benchmarks (sluicegate.testing); re-exported.
__all__ = [
    "CHANNEL_OPTIONS",
    "HOST_METADATA_A",
    "ROUTE_METADATA_V1",
    "TABLE",
    "body_message",
    "error_of",
    "exchange",
    "headers_message",
    "routed_model",
    "set_headers",
    "usage_header",
]

TABLE = RoutingTable(
    {
        "gpt-4o": RouteInfo("chat"),
        "llama-3-70b": RouteInfo("chat"),
        "модель-1": RouteInfo("unicode"),
        "team/model:v1": RouteInfo("team", "/team/v1/"),
    }
)
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


async def exchange(channel: grpc.aio.Channel, stage: str | None, *requests: Any) -> list[Any]:
    """Send each request on one Process stream, reading one answer after each."""
    stub = ep_grpc.ExternalProcessorStub(channel)
    metadata = ((wire.STAGE_METADATA_KEY, stage),) if stage is not None else None
    call = stub.Process(metadata=metadata, timeout=10)
    answers = []
    for request in requests:
        await call.write(request)
        answers.append(await call.read())
    await call.done_writing()
    return answers


def set_headers(common: Any) -> dict[str, bytes]:
    result = {}
    for option in common.header_mutation.set_headers:
        assert option.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
        result[option.header.key] = option.header.raw_value
    return result


def error_of(answer: Any) -> tuple[int, dict[str, Any]]:
    """(status, error object) of an immediate response; asserts OpenAI's error shape."""
    assert answer.WhichOneof("response") == "immediate_response", answer
    immediate = answer.immediate_response
    content_types = [
        h.header.raw_value for h in immediate.headers.set_headers if h.header.key == "content-type"
    ]
    assert content_types == [b"application/json"]
    document = json.loads(immediate.body)
    assert set(document) == {"error"}
    error = document["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return immediate.status.code, error


def streamed(answer: Any) -> bool:
    """Whether a routing answer sends the request to its route's stream twin."""
    return wire.STREAM_HEADER in set_headers(answer.request_body.response)


def usage_header(answer: Any) -> bytes | None:
    """Who a routing answer says reads the usage (None: not set)."""
    return set_headers(answer.request_body.response).get(wire.USAGE_HEADER)


def routed_model(answer: Any) -> str:
    """The model an answer routes to (asserts it is a routing answer)."""
    assert answer.WhichOneof("response") == "request_body", answer
    common = answer.request_body.response
    assert common.clear_route_cache
    headers = set_headers(common)
    # Besides the model, at most the stream mark (selects the route's stream twin), the
    # word on who reads the usage and, when the body is sent with its usage asked for
    # (filters/usage_reader.py), its new length.
    assert next(iter(headers)) == wire.MODEL_HEADER
    others = {wire.STREAM_HEADER, wire.USAGE_HEADER, "content-length"}
    assert headers.keys() - {wire.MODEL_HEADER} <= others
    assert headers.get(wire.STREAM_HEADER, b"true") == b"true"
    assert headers.get(wire.USAGE_HEADER, b"log").decode() in wire.USAGE_READERS
    # The body goes on as the client wrote it, or with its stream's usage asked for.
    if common.HasField("body_mutation"):
        assert headers["content-length"] == str(len(common.body_mutation.body)).encode()
    return headers[wire.MODEL_HEADER].decode()
