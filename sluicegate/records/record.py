"""RequestRecord: what one request was, decoded from the log record Envoy sent for it.

Envoy's OpenTelemetry access log (xds/translate/record_log.py) sends one log record per
request, its fields named by wire.RECORD_* in one string (docs/metrics.md, "The record").
`decode` turns one into a RequestRecord and never raises: a missing field, Envoy's
"-" for a value it does not have, and a number that does not parse or is out of range
each leave that field empty ("" or None), so one odd entry costs its own fields, never
the batch. The request's metadata comes one key a field, as its value's text
(wire.metadata_field).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sluicegate import local_replies, wire

# Envoy's value for a format command it has nothing for.
_ABSENT: Final = "-"
# A string field longer than this is cut: the model comes from a client's body.
MAX_TEXT: Final = 256
# Microsecond timings and counts beyond this are not a request's (about 31 years in µs).
_MAX_DIGITS: Final = 15

# Not an answer: no response was sent because the client left first (status 0, flag DC).
CLIENT_CLOSED: Final = "client_closed"
_CLIENT_DISCONNECT_FLAG: Final = "DC"
# Longer details are no ext_proc server's answer (codes are short snake_case names).
_MAX_DETAILS_CODE: Final = 64
# The codes of Envoy's key check's refusals (a 401 before any tenant is known).
_KEY_REFUSALS: Final = frozenset(
    refusal.code for refusal in local_replies.FAST_LANE_REFUSALS if refusal.status == 401
)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request, admitted or refused. Text fields are "" when unknown, numbers None.
    Times are seconds from the request's first byte (Envoy's DS_RX_BEG)."""

    route: str
    provider: str  # the provider that answered the last attempt
    model: str  # as the client asked
    model_sent: str  # as that provider was asked (its model_map applied)
    tenant: str
    key_name: str  # the key's name in the config, never the key
    priority: str
    scenario: str
    status: int  # 0: no response was sent (the client left first)
    status_class: str  # "2xx" … "5xx", or "none"
    flags: str  # Envoy's response flags, e.g. "UT,URX"
    code_details: str
    error_code: str  # "" for an answer that is not an error
    attempts: int  # upstream attempts; 0 for a request no provider saw
    stream: bool
    queue_s: float | None
    first_upstream_byte_s: float | None  # the provider's response headers
    ttft_s: float | None  # the provider's first body byte: time to first token
    first_downstream_byte_s: float | None
    duration_s: float | None  # the last byte sent to the client
    input_tokens: int | None
    output_tokens: int | None
    start_unix_ns: int  # when the request began (wall clock); 0 if unknown
    # Events of a stream that carried generated text (Envoy's count; None: not counted).
    content_events: int | None = None
    # The admission stage's reservation ("" for none) and its estimate, for the charge.
    reservation: str = ""
    estimate_input: int = 0
    estimate_output: int = 0
    usage_by_observer: bool = False  # the usage observer charges it (a large JSON answer)
    # A request of an `auto` tenant (wire.META_AUTO_LANE), in either lane.
    auto_lane: bool = False
    # A request the fast lane's buckets charged (the model reader's
    # wire.META_CHARGED_TENANT): Envoy admitted it, not the routing stage.
    fast_lane: bool = False
    # Envoy's id of the request, the same in each of its records.
    stream_id: str = ""
    # Sent while the request still runs (the lane log's periodic records): not its end.
    in_flight: bool = False
    # The answering attempt's request sent (US_TX_BEG) to the provider's first body byte:
    # the provider's own time to first token (not counted from the request's first byte).
    provider_ttft_s: float | None = None

    @property
    def counted_events(self) -> int | None:
        """A stream's events that carried text, as Envoy counted them (about one token
        each with most providers; docs/metrics.md); None for an answer that is not a
        stream, or a stream Envoy did not count."""
        return self.content_events if self.stream else None

    @property
    def output_tokens_or_events(self) -> int | None:
        """The output the metrics count: the provider's usage, else, for a stream that
        ended without it (a provider that does not send it, a stream cut short), its
        counted events."""
        return self.output_tokens if self.output_tokens is not None else self.counted_events


def _text(value: str | None) -> str:
    if not value or value == _ABSENT:
        return ""
    return value if len(value) <= MAX_TEXT else value[:MAX_TEXT]


def _count(value: str | None) -> int | None:
    """A whole non-negative decimal as Envoy writes them; anything else None."""
    if value and len(value) <= _MAX_DIGITS and value.isascii() and value.isdigit():
        return int(value)
    return None


def _seconds_from_us(value: str | None) -> float | None:
    micros = _count(value)
    return None if micros is None else micros / 1_000_000


_META_KEYS: Final = wire.record_metadata_keys(wire.METADATA_NAMESPACE)
_USAGE_KEYS: Final = wire.record_metadata_keys(wire.USAGE_METADATA_NAMESPACE)


def _metadata(attrs: Mapping[str, str], keys: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The `keys` (_META_KEYS, _USAGE_KEYS) that have a value, as Envoy wrote them."""
    found = {}
    for field, key in keys:
        value = attrs.get(field)
        if value and value != _ABSENT:
            found[key] = value
    return found


# A JSON number, as Envoy writes a metadata number (20, 2.5, 1.0e+300); a boolean, other
# text and "Infinity" are none.
_JSON_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_MAX_NUMBER_TEXT: Final = 32


def _number(value: str | None) -> float | None:
    if not value or len(value) > _MAX_NUMBER_TEXT or not _JSON_NUMBER.fullmatch(value):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _meta_text(meta: Mapping[str, str], key: str) -> str:
    return _text(meta.get(key))


def _model(meta: Mapping[str, str]) -> str:
    """The model as the client asked; "" for one holding a newline: no route serves such a
    model, and a provider's usage member as text with a newline leaves its tail here
    (wire.RECORD_METADATA_FIELDS), which must not become a model's label."""
    model = _meta_text(meta, wire.META_MODEL)
    return "" if "\n" in model else model


def _tokens(usage: Mapping[str, str], *keys: str) -> int | None:
    """The first member that is a whole count up to wire.MAX_USAGE_TOKENS, as the body
    parser takes them (Envoy keeps a JSON number as a double and may write one as 20.0)."""
    for key in keys:
        value = _number(usage.get(key))
        if value is not None and value == int(value) and 0 <= value <= wire.MAX_USAGE_TOKENS:
            return int(value)
    return None


def _queue_seconds(value: str | None) -> float | None:
    """wire.META_QUEUE_MS: milliseconds, a number or its decimal text."""
    ms = _number(value)
    if ms is None or ms < 0 or ms > 1e12:
        return None
    return ms / 1000


def _stream(meta: Mapping[str, str], content_type: str) -> bool:
    """What the routing stage saw in the body (wire.META_STREAM: a boolean or its text);
    without it, whether the answer was an event stream."""
    value = meta.get(wire.META_STREAM)
    if value in ("true", "false"):
        return value == "true"
    return content_type.lower().startswith("text/event-stream")


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status <= 599 else "none"


def error_code(meta_code: str, status: int, details: str, flags: str, route: str = "") -> str:
    """The OpenAI error `code` the client got ("" for none: a success, or a reply whose
    code is null). The ext_proc server's own answers carry it in the metadata or the
    details; a provider's error answer is wire.PROVIDER_ERROR (its own code is not read);
    Envoy's own replies get the code local_reply_config gave them, read from the same
    table (sluicegate.local_replies). A request nobody answered is CLIENT_CLOSED when the
    client left (flag DC), else "". A refusal Envoy's model reader routed to its answer
    (docs/fast-lane.md) is named by that `route`."""
    if meta_code:
        return meta_code
    if (answered := local_replies.answered_code(route)) is not None:
        return answered
    flag_set = local_replies.split_flags(flags)
    if status == 0:
        return CLIENT_CLOSED if _CLIENT_DISCONNECT_FLAG in flag_set else ""
    if status < 400:
        return ""
    prefix = wire.EXT_PROC_DETAILS_PREFIX
    if details.startswith(prefix) and len(details) <= len(prefix) + _MAX_DETAILS_CODE:
        return details[len(prefix) :]
    if details == "via_upstream":
        return wire.PROVIDER_ERROR
    return local_replies.local_reply_code(status, details, flag_set) or ""


def log_name(log_record: Any) -> str:
    """The name of the log that sent the record (its body's first line: wire.record_body);
    "" for a record without a body."""
    body: str = log_record.body.string_value
    return body.partition("\n")[0]


def fields_of(log_record: Any) -> dict[str, str]:
    """The record's fields by key, from its body (wire.record_fields). A record without a
    body comes from an Envoy still on the config from before the body (an upgrade under
    way: a replica or sidecar whose control plane is older or newer): its attributes, of
    which those named as today's fields are read (its route, provider, status, timings),
    so the record is not lost meanwhile; its metadata, sent as JSON then, is not."""
    body = log_record.body.string_value
    if body:
        return wire.record_fields(body)
    return {item.key: item.value.string_value for item in log_record.attributes}


def scenario_of(route_scenario: str, asked: str | None, declared: frozenset[str]) -> str:
    """The request's scenario: the one the client asked for (wire.SCENARIO_HEADER) when it
    is declared, else its route's. An undeclared or malformed value is ignored: a header
    that only labels a request never fails it. The routing stage's rule, and the record's
    for a request no routing stage saw (RecordDefaults)."""
    if asked:
        # A repeated header arrives joined by commas (no name holds one): the last counts.
        asked = asked.rpartition(",")[2].strip().lower()
        if asked in declared:
            return asked
    return route_scenario


@dataclass(frozen=True, slots=True)
class RecordDefaults:
    """What a request the routing stage did not name is recorded as (Envoy routed it
    alone: docs/fast-lane.md), as the routing stage would have named it: its scenario is
    the client's header when declared, else its route's (none for a request no route
    served); in a gateway without tenants, a routed request is the anonymous tenant's, of
    the default class, and one Envoy refused (a 404, a body it could not route) the
    anonymous tenant's without a class."""

    by_route: Mapping[str, str]  # route -> its scenario
    declared: frozenset[str]  # every scenario a client may ask for
    # The default class, for a gateway without tenants; None with tenants.
    anonymous_class: str | None = None

    def scenario(self, route: str, asked: str) -> str:
        route_scenario = self.by_route.get(route)
        return "" if route_scenario is None else scenario_of(route_scenario, asked, self.declared)


def decode(
    log_record: Any,
    model_maps: Mapping[str, Mapping[str, str]],
    defaults: RecordDefaults | None = None,
) -> RequestRecord:
    """One OTel LogRecord (opentelemetry.proto.logs.v1) as a RequestRecord; `model_maps`
    is each provider's model_map (client model -> provider model); `defaults` names what
    the routing stage did not (without it: nothing). Never raises."""
    attrs = fields_of(log_record)
    meta = _metadata(attrs, _META_KEYS)
    usage = _metadata(attrs, _USAGE_KEYS)
    provider = _text(attrs.get(wire.RECORD_PROVIDER))
    model = _model(meta)
    status = _count(attrs.get(wire.RECORD_STATUS)) or 0
    if status > 999:
        status = 0
    flags = _text(attrs.get(wire.RECORD_FLAGS))
    details = _text(attrs.get(wire.RECORD_DETAILS))
    model_sent = model_maps.get(provider, {}).get(model, model) if provider else ""
    start = getattr(log_record, "time_unix_nano", 0)
    code = error_code(
        _meta_text(meta, wire.META_ERROR_CODE),
        status,
        details,
        flags,
        _text(attrs.get(wire.RECORD_ROUTE)),
    )
    # The routing stage names the model route of a request it refused after routing.
    route = _meta_text(meta, wire.META_ROUTE) or _text(attrs.get(wire.RECORD_ROUTE))
    scenario = _meta_text(meta, wire.META_SCENARIO)
    tenant = _meta_text(meta, wire.META_TENANT)
    priority = _meta_text(meta, wire.META_PRIORITY)
    if defaults is not None:
        if not scenario:
            scenario = defaults.scenario(route, _meta_text(meta, wire.META_SCENARIO_ASKED))
        if not tenant and defaults.anonymous_class is not None:
            if route in defaults.by_route:
                tenant, priority = wire.ANONYMOUS_TENANT, priority or defaults.anonymous_class
            elif route == wire.NOT_FOUND_ROUTE or local_replies.answered_code(route):
                # Envoy's refusals: the routing stage's are the anonymous tenant's, with no
                # class.
                tenant = wire.ANONYMOUS_TENANT
    return RequestRecord(
        route=route,
        provider=provider,
        model=model,
        model_sent=model_sent,
        # Envoy's key check refuses a request before anything names its tenant: it is the
        # anonymous tenant's, as the routing stage's refusals of keys are.
        tenant=tenant or (wire.ANONYMOUS_TENANT if code in _KEY_REFUSALS else ""),
        key_name=_meta_text(meta, wire.META_KEY_NAME),
        priority=priority,
        scenario=scenario,
        status=status,
        status_class=status_class(status),
        flags=flags,
        code_details=details,
        error_code=code,
        attempts=_count(attrs.get(wire.RECORD_ATTEMPTS)) or 0,
        stream=_stream(meta, _text(attrs.get(wire.RECORD_CONTENT_TYPE))),
        queue_s=_queue_seconds(meta.get(wire.META_QUEUE_MS)),
        first_upstream_byte_s=_seconds_from_us(attrs.get(wire.RECORD_FIRST_UPSTREAM_BYTE_US)),
        ttft_s=_seconds_from_us(attrs.get(wire.RECORD_FIRST_UPSTREAM_BODY_US)),
        first_downstream_byte_s=_seconds_from_us(attrs.get(wire.RECORD_FIRST_DOWNSTREAM_BYTE_US)),
        duration_s=_seconds_from_us(attrs.get(wire.RECORD_LAST_DOWNSTREAM_BYTE_US)),
        input_tokens=_tokens(usage, "prompt_tokens", "input_tokens"),
        output_tokens=_tokens(usage, "completion_tokens", "output_tokens"),
        start_unix_ns=start if isinstance(start, int) and start > 0 else 0,
        content_events=_tokens(usage, wire.USAGE_CONTENT_EVENTS),
        reservation=_meta_text(meta, wire.META_RESERVATION),
        estimate_input=_count(_meta_text(meta, wire.META_ESTIMATE_INPUT)) or 0,
        estimate_output=_count(_meta_text(meta, wire.META_ESTIMATE_OUTPUT)) or 0,
        usage_by_observer=meta.get(wire.META_USAGE_VIA) == wire.USAGE_VIA_OBSERVER,
        auto_lane=meta.get(wire.META_AUTO_LANE) == "true",
        fast_lane=bool(_meta_text(meta, wire.META_CHARGED_TENANT)),
        stream_id=_text(attrs.get(wire.RECORD_STREAM_ID)),
        in_flight=attrs.get(wire.RECORD_LOG_TYPE) == wire.LOG_TYPE_IN_FLIGHT,
        provider_ttft_s=_seconds_from_us(attrs.get(wire.RECORD_PROVIDER_TTFT_US)),
    )
