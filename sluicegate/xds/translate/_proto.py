"""Small protobuf helpers shared by the translate modules (private to this room)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any as AnyValue

from envoy.type.matcher.v3 import http_inputs_pb2
from google.protobuf import any_pb2, duration_pb2, struct_pb2
from google.protobuf.message import Message
from xds.core.v3 import extension_pb2 as xds_extension_pb2
from xds.type.matcher.v3 import matcher_pb2

REQUEST_HEADER_INPUT = "envoy.matching.inputs.request_headers"


def request_header_tree(header_name: str) -> matcher_pb2.Matcher.MatcherTree:
    """An empty matcher tree on one request header's value (callers fill its map)."""
    return matcher_pb2.Matcher.MatcherTree(
        input=xds_extension_pb2.TypedExtensionConfig(
            name=REQUEST_HEADER_INPUT,
            typed_config=pack(http_inputs_pb2.HttpRequestHeaderMatchInput(header_name=header_name)),
        ),
    )


def pack(message: Message) -> any_pb2.Any:
    """Wrap a typed config in `google.protobuf.Any`, as every Envoy extension slot wants.

    Deterministic, so map fields (Struct metadata) serialize the same way every time and
    the control plane's content hashes change only when the content does (xDS rule 3)."""
    packed = any_pb2.Any()
    packed.Pack(message, deterministic=True)
    return packed


def duration_ms(milliseconds: int) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromMilliseconds(milliseconds)
    return value


def duration_s(seconds: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds)


def struct(values: Mapping[str, AnyValue]) -> struct_pb2.Struct:
    """A `Struct` from plain Python values (str, number, bool, None, nested dicts/lists)."""
    result = struct_pb2.Struct()
    result.update(dict(values))
    return result
