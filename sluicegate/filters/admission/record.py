"""What the routing stage tells the request record: the facts only it knows.

Every request the routing stage answers or passes on leaves, in Envoy's dynamic metadata
(namespace wire.METADATA_NAMESPACE), as much as it knew by its last answer: the tenant
(`anonymous` without a key), the key's name (never the key), the model as asked, the
priority class, the scenario, the time queued at gates, whether a stream was asked for,
the OpenAI error `code` of an answer it made itself, and, for an `auto` tenant,
wire.META_AUTO_LANE (a boolean, as the fast lane's model reader writes it). Envoy keeps
metadata returned with an immediate response too (checked on Envoy 1.40), so refusals are
recorded like admitted requests; the access log reads it from there (docs/admission.md, "What the
request record learns from the routing stage").

The metadata is written once per request, on the stage's last answer, from entries built
once and reused (responses.metadata_fields): only an unrouted model as asked, a queue time
above zero, the reservation and the x-ratelimit-* values are encoded per request, and a
request that is only routed gets its whole metadata from a cache (routed_record).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from google.protobuf import struct_pb2

from sluicegate import wire

from ..errors import shown_model
from ..responses import error_code_of, metadata_answer, metadata_field
from ..usage_reader import INJECTED_FIELD

ANONYMOUS: Final = wire.ANONYMOUS_TENANT  # the tenant of a request without a client key
NO_SCENARIO: Final = ""  # the scenario of a request no route serves


@lru_cache(maxsize=4096)
def known_field(key: str, value: str) -> bytes:
    """An entry whose value comes from the config or the filter itself (tenant, key name,
    class, scenario, routed model, error code): few distinct values, so each is built
    once. A client's own text (an unrouted model) must not go through here."""
    return metadata_field(key, value)


_NOT_QUEUED: Final = metadata_field(wire.META_QUEUE_MS, 0)
_STREAM: Final = {
    True: metadata_field(wire.META_STREAM, "true"),
    False: metadata_field(wire.META_STREAM, "false"),
}


def _true_field(key: str) -> bytes:
    """An entry whose value is the Struct boolean `true` (not the text "true")."""
    entry = struct_pb2.Struct()
    entry.fields[key].bool_value = True
    serialized: bytes = entry.SerializeToString()
    return serialized


# A request of an `auto` tenant, as the model reader marks one in the fast lane.
_AUTO_LANE: Final = _true_field(wire.META_AUTO_LANE)


def record_fields(
    *,
    tenant: str,
    key_name: str | None,
    model: str | None,
    routed: bool,
    priority: str,
    scenario: str,
    queued_s: float,
    stream: bool | None,
    auto_lane: bool = False,
) -> bytes:
    """The record's entries (responses.metadata_fields, concatenated). `None` is unknown at
    this point and left out; `routed`: `model` is one a route serves (so from the config);
    `auto_lane`: the tenant is `auto` (wire.META_AUTO_LANE). A routed request that did not
    queue, most of them, takes its entries whole from a cache: every value then comes from
    the config."""
    if routed and queued_s <= 0:
        return _routed_fields(tenant, key_name, model, priority, scenario, stream, auto_lane)
    return _fields(tenant, key_name, model, routed, priority, scenario, queued_s, stream, auto_lane)


@lru_cache(maxsize=4096)
def _routed_fields(
    tenant: str,
    key_name: str | None,
    model: str | None,
    priority: str,
    scenario: str,
    stream: bool | None,
    auto_lane: bool = False,
) -> bytes:
    return _fields(tenant, key_name, model, True, priority, scenario, 0.0, stream, auto_lane)


def _fields(
    tenant: str,
    key_name: str | None,
    model: str | None,
    routed: bool,
    priority: str,
    scenario: str,
    queued_s: float,
    stream: bool | None,
    auto_lane: bool = False,
) -> bytes:
    fields = [
        known_field(wire.META_TENANT, tenant),
        known_field(wire.META_PRIORITY, priority),
        known_field(wire.META_SCENARIO, scenario),
        _NOT_QUEUED if queued_s <= 0 else metadata_field(wire.META_QUEUE_MS, queued_s * 1000),
    ]
    if key_name is not None:
        fields.append(known_field(wire.META_KEY_NAME, key_name))
    if model is not None:
        # An unrouted model is the client's own text, kept as short as its 404 shows it.
        fields.append(
            known_field(wire.META_MODEL, model)
            if routed
            else metadata_field(wire.META_MODEL, shown_model(model))
        )
    if stream is not None:
        fields.append(_STREAM[stream])
    if auto_lane:
        fields.append(_AUTO_LANE)
    return b"".join(fields)


@lru_cache(maxsize=4096)
def routed_record(
    tenant: str,
    key_name: str | None,
    model: str,
    priority: str,
    scenario: str,
    stream: bool,
    usage_injected: bool = False,
) -> bytes:
    """The whole metadata (responses.metadata_answer, to append to the routed answer) of a
    routed request that did not queue and carries nothing else (no reservation): every
    value comes from the config, so each combination is built once. `usage_injected`: the
    stream's usage event was asked for the client (usage_reader.py)."""
    fields = _routed_fields(tenant, key_name, model, priority, scenario, stream)
    if usage_injected:
        fields += INJECTED_FIELD
    return metadata_answer(wire.METADATA_NAMESPACE, fields)


def with_record(answer: bytes, fields: bytes, *, made_here: bool = False) -> bytes:
    """`answer` carrying the record in its dynamic metadata; `made_here`: the answer is
    an immediate response the filter made, whose error `code` (if it is an error) is
    recorded too. `answer` must carry no dynamic metadata of its own (the two would not
    merge: the later namespace entry replaces the earlier)."""
    code = error_code_of(answer) if made_here else None
    if code is not None:
        fields += known_field(wire.META_ERROR_CODE, code)
    return answer + metadata_answer(wire.METADATA_NAMESPACE, fields)
