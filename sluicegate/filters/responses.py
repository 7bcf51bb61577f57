"""Pre-serialized ext_proc answers and the builders for the few that vary.

The server's response serializer is the identity: every handler returns the
wire bytes of a `ProcessingResponse`. Answers that never change (continue, the
fixed client errors) are serialized once at import time, so the hot path does
not allocate protobuf messages for them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

_OVERWRITE: Final = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_JSON_CONTENT_TYPE: Final = base_pb2.HeaderValueOption(
    header=base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
    append_action=_OVERWRITE,
)


def set_header(key: str, value: bytes) -> Any:
    """A `HeaderValueOption` that replaces every value of `key` with `value`."""
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value), append_action=_OVERWRITE
    )


def common(
    headers: list[Any] | None = None,
    body: bytes | None = None,
    *,
    clear_route_cache: bool = False,
) -> Any:
    """A `CommonResponse` (CONTINUE) with optional header and body mutations."""
    response = ep.CommonResponse(clear_route_cache=clear_route_cache)
    if headers:
        response.header_mutation.set_headers.extend(headers)
    if body is not None:
        response.body_mutation.body = body
    return response


def with_path(answer: bytes, path: bytes) -> bytes:
    """A serialized answer to request headers that also sets `:path` (the routing stage's
    answer to a query carrying credentials: rare, so parsed and built again here). An
    immediate response is returned as it is."""
    message = ep.ProcessingResponse.FromString(answer)
    if message.WhichOneof("response") != "request_headers":
        return answer
    message.request_headers.response.header_mutation.set_headers.append(set_header(":path", path))
    result: bytes = message.SerializeToString()
    return result


def request_headers_answer(response: Any, dynamic_metadata: Any = None) -> bytes:
    """Serialized answer to a `request_headers` message."""
    message = ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=response))
    if dynamic_metadata is not None:
        message.dynamic_metadata.CopyFrom(dynamic_metadata)
    result: bytes = message.SerializeToString()
    return result


def request_body_answer(response: Any) -> bytes:
    """Serialized answer to a `request_body` message."""
    message = ep.ProcessingResponse(request_body=ep.BodyResponse(response=response))
    result: bytes = message.SerializeToString()
    return result


def namespace_struct(namespace: str, values: dict[str, str]) -> Any:
    """Dynamic metadata `{namespace: {key: value}}` as a `google.protobuf.Struct`."""
    outer = struct_pb2.Struct()
    inner = outer.fields[namespace].struct_value
    for key, value in values.items():
        inner.fields[key].string_value = value
    return outer


def openai_error(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> bytes:
    """An OpenAI-style error document, always valid UTF-8: a message may echo client text
    (a model name) holding a lone surrogate, which UTF-8 cannot carry, so any such code
    point becomes U+FFFD rather than failing the request."""
    document = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return utf8_text(json.dumps(document, ensure_ascii=False))


def utf8_text(text: str) -> bytes:
    """`text` as UTF-8, each lone surrogate replaced by U+FFFD (JSON's "\\ud800" escapes
    and undecodable header bytes kept by surrogateescape both produce them)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def immediate_error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> bytes:
    """Serialized `ImmediateResponse` carrying an OpenAI-style JSON error (and any extra
    response headers, e.g. Retry-After and x-ratelimit-* on a 429)."""
    body = openai_error(message, type=type, param=param, code=code)
    return immediate_json(status, body, details=f"sluicegate_{code or type}", headers=headers)


def immediate_json(
    status: int, body: bytes, *, details: str, headers: Sequence[tuple[str, str]] = ()
) -> bytes:
    """Serialized `ImmediateResponse` with a JSON body; `details` shows in Envoy's logs."""
    immediate = ep.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), body=body, details=details
    )
    immediate.headers.set_headers.append(_JSON_CONTENT_TYPE)
    immediate.headers.set_headers.extend(
        set_header(key, value.encode("utf-8")) for key, value in headers
    )
    result: bytes = ep.ProcessingResponse(immediate_response=immediate).SerializeToString()
    return result


def _continue(field: str, answer_type: Any) -> bytes:
    result: bytes = ep.ProcessingResponse(**{field: answer_type()}).SerializeToString()
    return result


CONTINUE_REQUEST_HEADERS: Final = _continue("request_headers", ep.HeadersResponse)
CONTINUE_REQUEST_BODY: Final = _continue("request_body", ep.BodyResponse)

# A message of a kind a stage does not act on is answered "continue, unchanged",
# keyed by the `ProcessingRequest.request` oneof field name.
PASS_THROUGH: Final[dict[str, bytes]] = {
    "request_headers": CONTINUE_REQUEST_HEADERS,
    "request_body": CONTINUE_REQUEST_BODY,
    "response_headers": _continue("response_headers", ep.HeadersResponse),
    "response_body": _continue("response_body", ep.BodyResponse),
    "request_trailers": _continue("request_trailers", ep.TrailersResponse),
    "response_trailers": _continue("response_trailers", ep.TrailersResponse),
}

INTERNAL_ERROR: Final = immediate_error(
    500,
    "The gateway failed to process the request.",
    type="server_error",
    code="internal_error",
)
