"""Builders and readers for ext_proc messages, shared by the filter tests."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from sluicegate import wire
from sluicegate.filters import RouteInfo, RoutingTable

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
# What Envoy 1.40 sent for an endpoint in a real run (attribute xds.upstream_host_metadata).
HOST_METADATA_A = (
    'filter_metadata { key: "sluicegate" value { fields { key: "model_map" value { '
    'struct_value { fields { key: "m1" value { string_value: "a-m1" } } } } } fields { '
    'key: "path_prefix" value { string_value: "/pa/" } } fields { key: "provider" value { '
    'string_value: "a" } } } } '
)
ROUTE_METADATA_V1 = (
    'filter_metadata { key: "sluicegate" value { fields { key: "path_prefix" value { '
    'string_value: "/v1/" } } fields { key: "route" value { string_value: "r1" } } } } '
)


def headers_message(
    path: str = "/v1/chat/completions",
    *,
    end_of_stream: bool = False,
    extra: Sequence[tuple[str, str]] = (),
    content_length: int | None = None,
    attributes: Mapping[str, str] | None = None,
    original_path: str | None = None,
    method: str = "POST",
) -> Any:
    request = ep.ProcessingRequest()
    headers = request.request_headers.headers.headers
    pairs = [(":path", path), (":method", method), *extra]
    if content_length is not None:
        pairs.append(("content-length", str(content_length)))
    for key, value in pairs:
        headers.add(key=key, raw_value=value.encode())
    request.request_headers.end_of_stream = end_of_stream
    if attributes:
        fields = request.attributes["envoy.filters.http.ext_proc"].fields
        for key, value in attributes.items():
            fields[key].string_value = value
    if original_path is not None:
        namespace = request.metadata_context.filter_metadata[wire.METADATA_NAMESPACE]
        namespace.fields["original_path"].string_value = original_path
    return request


def body_message(body: bytes, *, end_of_stream: bool = True) -> Any:
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=end_of_stream))


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


def usage_header(answer: Any) -> bytes | None:
    """Who a routing answer says reads the usage (None: not set)."""
    return set_headers(answer.request_body.response).get(wire.USAGE_HEADER)


def routed_model(answer: Any) -> str:
    """The model an answer routes to (asserts it is a routing answer)."""
    assert answer.WhichOneof("response") == "request_body", answer
    common = answer.request_body.response
    assert common.clear_route_cache
    headers = set_headers(common)
    # Besides the model, at most the admission stage's word on who reads the usage.
    assert next(iter(headers)) == wire.MODEL_HEADER
    assert headers.keys() - {wire.MODEL_HEADER} <= {wire.USAGE_HEADER}
    assert headers.get(wire.USAGE_HEADER, b"log") in (b"log", b"observer", b"none")
    assert not common.HasField("body_mutation")
    return headers[wire.MODEL_HEADER].decode()
