"""Small protobuf helpers shared by the translate modules (private to this room)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any as AnyValue

from google.protobuf import any_pb2, duration_pb2, struct_pb2
from google.protobuf.message import Message


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
