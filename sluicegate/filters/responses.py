"""Pre-serialized ext_proc answers and the builders for the few that vary.

The server's response serializer is the identity: every handler returns the
wire bytes of a `ProcessingResponse`. Answers that never change (continue, the
fixed client errors) are serialized once at import time, so the hot path does
not allocate protobuf messages for them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Final

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from sluicegate import wire

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


# Dynamic metadata in pieces: a Struct's `fields` is a map, and on the wire a map is a
# repeated field of entries, so serialized Structs of different keys concatenate into one
# Struct. The routing stage builds each request's metadata mostly from entries built once
# (a tenant's, a scenario's, …) and wraps them by hand (metadata_answer): a cached request
# then costs no protobuf message at all. Tags are (field number << 3 | wire type);
# tests/filters/test_request_record.py checks them against the descriptors.
_ENTRY: Final = b"\x0a"  # Struct.fields (1), and MapEntry.key (1): length-delimited
_ENTRY_VALUE: Final = b"\x12"  # MapEntry.value (2)
_STRUCT_VALUE: Final = b"\x2a"  # Value.struct_value (5)
_DYNAMIC_METADATA: Final = b"\x42"  # ProcessingResponse.dynamic_metadata (8)


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def metadata_fields(values: Mapping[str, str | float]) -> bytes:
    """`values` (strings or numbers) as the serialized entries of a Struct, to concatenate
    with others of different keys into the fields of one Struct (metadata_answer). A
    string holding a lone surrogate (a client's text) has it replaced by U+FFFD."""
    message = struct_pb2.Struct()
    fields = message.fields
    for key, value in values.items():
        if isinstance(value, str):
            fields[key].string_value = value if value.isascii() else _valid_text(value)
        else:
            fields[key].number_value = value
    result: bytes = message.SerializeToString()
    return result


def metadata_field(key: str, value: str | float) -> bytes:
    """One entry (metadata_fields)."""
    return metadata_fields({key: value})


def _valid_text(value: str) -> str:
    return utf8_text(value).decode("utf-8")


def metadata_answer(namespace: str, fields: bytes) -> bytes:
    """A serialized ProcessingResponse holding only dynamic metadata `{namespace: Struct}`
    whose fields are `fields` (metadata_fields, concatenated). Appended to another
    serialized answer it merges into it: the wire form of a message is the concatenation
    of its fields, so the answer keeps its own and gains dynamic_metadata."""
    namespace_entry = _namespace_key(namespace) + _delimited(
        _ENTRY_VALUE, _delimited(_STRUCT_VALUE, fields)
    )
    return _delimited(_DYNAMIC_METADATA, _delimited(_ENTRY, namespace_entry))


@lru_cache(maxsize=8)
def _namespace_key(namespace: str) -> bytes:
    return _delimited(_ENTRY, namespace.encode())


@lru_cache(maxsize=256)
def error_code_of(answer: bytes) -> str | None:
    """The OpenAI error `code` of an immediate response the filter made (read from the
    answer itself, so it cannot drift from what the client is told); None for any other
    answer. Cached: most refusals are the same few prebuilt answers."""
    message = ep.ProcessingResponse.FromString(answer)
    if message.WhichOneof("response") != "immediate_response":
        return None
    immediate = message.immediate_response
    if immediate.status.code < 400:
        return None
    try:
        error = json.loads(immediate.body).get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


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
    details = f"{wire.EXT_PROC_DETAILS_PREFIX}{code or type}"
    return immediate_json(status, body, details=details, headers=headers)


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
