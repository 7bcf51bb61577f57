"""Names that several rooms must agree on: headers, cluster names, metadata keys.

The translator writes them into Envoy config, the ext_proc filter reads and sets
them, the bootstrap declares the clusters. One place, so they cannot drift.
"""

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

# Set by the ext_proc filter from the request body's "model"; routes match on it.
MODEL_HEADER: Final = "x-sluicegate-model"
# Set per upstream attempt from the chosen endpoint's metadata (logs, tests).
PROVIDER_HEADER: Final = "x-sluicegate-provider"
# gRPC initial metadata that tells the ext_proc server which stage is calling.
STAGE_METADATA_KEY: Final = "x-sluicegate-stage"
STAGE_ROUTING: Final = "routing"  # downstream HTTP filter: parse body, pick route
STAGE_ATTEMPT: Final = "attempt"  # upstream (per attempt) filter: per-provider rewrites
STAGE_USAGE: Final = "usage"  # downstream observer: reads usage off the response, never waits
# downstream, a provider's non-JSON error answer only: wraps it in OpenAI's error JSON
STAGE_ERROR_BODY: Final = "error_body"

# Past a queued request's longest wait, how long Envoy still waits for the routing stage's
# answer: the filter asks for it (override_message_timeout), the translator allows it.
QUEUE_MARGIN_MS: Final = 2_000

# Optional client header choosing a priority class at or below the tenant's own.
PRIORITY_HEADER: Final = "x-sluicegate-priority"
# Client credentials the admission stage reads and removes before anything goes upstream.
CLIENT_KEY_HEADERS: Final = ("authorization", "x-api-key", "api-key")
# With a fast lane, Envoy's key check names the client here (client_name) for the model
# reader or, in the exact lane, the routing stage (docs/fast-lane.md, "Keys"); a
# client's own is removed before any filter runs, Envoy's before the request goes up.
CLIENT_HEADER: Final = "x-sluicegate-client"


def client_name(lane: str, tenant: str, key_name: str) -> str:
    """`<lane>/<tenant>/<key name>`: names hold no `/` (config.NAME_PATTERN)."""
    return f"{lane}/{tenant}/{key_name}"


def parse_client_name(value: str) -> tuple[str, str, str] | None:
    """(lane, tenant, key name) of a client_name, or None."""
    parts = value.split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


# Query parameters that carry credentials somewhere (names compared decoded, lower-case,
# `-` read as `_`: filters/request_limits.py's credential_name): the routing stage and,
# for requests Envoy decides alone, the model reader remove them from the path before any
# provider sees it, leaving every other parameter byte for byte.
QUERY_CREDENTIALS: Final = frozenset(
    {
        "access_token", "api_key", "apikey", "auth", "auth_token", "authorization",
        "client_secret", "code", "key", "password", "secret", "sig", "signature",
        "subscription_key", "token", "x_api_key",
    }
)  # fmt: skip

# Request headers a client may send, as the routing stage sees them (Envoy's defaults:
# 100 headers, pseudo-headers and those Envoy adds on arrival included, and 60 KiB); the
# routing stage answers 431 above either. Envoy's own limit (HCM max_headers_count,
# max_request_headers_kb) is that plus the headroom: Envoy checks its limit again after
# every ext_proc header mutation, and the gateway adds headers after the routing stage
# (the model and usage headers, the router's x-envoy-*, the provider header and key,
# per-provider extra headers), so a valid request is never pushed over it into a 500
# (header_mutation_result_exceeds_limit).
MAX_REQUEST_HEADERS: Final = 100
MAX_REQUEST_HEADERS_KB: Final = 60
REQUEST_HEADERS_HEADROOM: Final = 32
REQUEST_HEADERS_HEADROOM_KB: Final = 16

# sluicegate's namespace of a request's dynamic metadata and of its endpoints' metadata.
METADATA_NAMESPACE: Final = "sluicegate"
# Dynamic metadata (namespace METADATA_NAMESPACE) the admission stage sets on an admitted
# request: its record (or the usage observer) charges the reservation from it, and routes
# turn the rate-limit values into OpenAI's x-ratelimit-* response headers without a
# round trip.
META_RESERVATION: Final = "reservation"
META_TENANT: Final = "tenant"
META_MODEL: Final = "model"
META_ESTIMATE_INPUT: Final = "estimate_input_tokens"
META_ESTIMATE_OUTPUT: Final = "estimate_output_tokens"
# Their sum: what a fast-lane `tokens` bucket is charged (docs/fast-lane.md).
META_ESTIMATE_TOKENS: Final = "estimate_tokens"
# The fast-lane tenant whose buckets a request is charged to: written by the model reader
# only for a request it routes (a listing or a refused body is not charged).
META_CHARGED_TENANT: Final = "charged_tenant"
# `true` on a request of an `auto` tenant, in whichever lane it is (the model reader
# writes it in the fast lane, the routing stage in the exact lane): the lane log sends
# these requests' records to the control plane, which moves the tenant between lanes,
# and the ext_proc servers charge a fast-lane one into the tenant's exact-lane windows
# (docs/fast-lane.md, "The auto lane").
META_AUTO_LANE: Final = "auto_lane"
# Set by the routing stage on every request it sees, admitted or answered, for the
# request record (docs/metrics.md): who asked (the key's name, never the key), with
# which priority class and scenario, how long the request queued at a gate (ms), and
# whether it asked for a stream; META_ERROR_CODE is the OpenAI error `code` of an answer
# the ext_proc server made itself, and META_ROUTE the model route of a request it refused
# after routing it (rate limited, shed …: Envoy's route is then not the model's).
META_KEY_NAME: Final = "key_name"
META_ROUTE: Final = "route"
META_PRIORITY: Final = "priority"
META_SCENARIO: Final = "scenario"
# The client's SCENARIO_HEADER as sent, written by the model reader in the fast lane (only
# when the config declares scenarios): the record's scenario is read from it
# (records/record.py, RecordDefaults), off the request's path. The header itself is gone
# by the request's end (the header allowlist removes it for the provider).
META_SCENARIO_ASKED: Final = "scenario_asked"
# Envoy's own routes (xds/translate/routes.py), named in their records: a path or model no
# route serves (404), the model listings, and the model reader's refusals (`answered-<problem>`,
# local_replies.answered_route_name).
NOT_FOUND_ROUTE: Final = "not-found"
MODELS_ROUTE: Final = "models"
ANSWERED_ROUTE_PREFIX: Final = "answered-"
# The metric label of a value outside the config's names, and of a missing value
# (records/labels.py): no name that becomes a label may take them (config validation).
OTHER_LABEL: Final = "other"
NO_VALUE_LABEL: Final = "none"
RESERVED_LABEL_VALUES: Final = (OTHER_LABEL, NO_VALUE_LABEL)
# Names a configured route may not take (config validation): its records would be read as
# one of Envoy's routes', or its series would merge with the unknown or missing routes'.
RESERVED_ROUTE_NAMES: Final = (NOT_FOUND_ROUTE, MODELS_ROUTE, *RESERVED_LABEL_VALUES)


def is_reserved_route_name(name: str) -> bool:
    """Whether a configured route may not take this name (RESERVED_ROUTE_NAMES, or one of
    the model reader's refusal routes)."""
    return name in RESERVED_ROUTE_NAMES or name.startswith(ANSWERED_ROUTE_PREFIX)


MAX_SCENARIO_ASKED: Final = 80  # bytes kept of it: a scenario's name is at most 63
META_QUEUE_MS: Final = "queue_ms"
META_STREAM: Final = "stream"
META_ERROR_CODE: Final = "error_code"
# Values the routing stage writes there that the records' labels must know: the tenant of
# a request without a client key (always a declared tenant), and the priority of a
# request refused before its class was resolved (labelled as a missing value).
ANONYMOUS_TENANT: Final = "anonymous"
NO_PRIORITY_CLASS: Final = NO_VALUE_LABEL
# An ext_proc server's answer carries `<prefix><its OpenAI error code>` as Envoy's
# response code details (filters/responses.py); the record reads the code back from it.
EXT_PROC_DETAILS_PREFIX: Final = "sluicegate_"
# The error `code` of a provider's error answer the gateway wraps in OpenAI's JSON
# (filters/error_body.py), and the record's code of any provider error answer.
PROVIDER_ERROR: Final = "provider_error"
# A client chooses the request's scenario among the declared ones (`scenarios:`) with
# this header; stripped before a provider sees it (the header allowlist).
SCENARIO_HEADER: Final = "x-sluicegate-scenario"
# On every refusal the gateway makes for capacity (a limit's 429, a shed's 503, the
# limiter store down, a pool full): the error code, so a client or `sluicegate bench` can
# tell the gateway's own refusals from a provider's 429 or 503, which never carry it.
REFUSAL_HEADER: Final = "x-sluicegate-refusal"
# On every admitted answer under admission: how long the request waited at its priority
# gate, in milliseconds (0: it did not wait), from the record's META_QUEUE_MS.
QUEUE_MS_HEADER: Final = "x-sluicegate-queue-ms"
# The request record (docs/metrics.md, "The record"): Envoy's OpenTelemetry access log
# sends one log record per request to the ext_proc servers' LogsService; its fields are
# named by these keys (the translator writes them, sluicegate.records reads them), in the
# order of RECORD_LAYOUT (record_body below).
# Renamed whenever RECORD_LAYOUT changes, so a record of another layout (an Envoy and an
# ext_proc server on two versions, an upgrade under way) decodes empty, never shifted.
RECORD_LOG_NAME: Final = "sluicegate-record-3"
RECORD_ROUTE: Final = "route"
RECORD_PROVIDER: Final = "provider"
RECORD_STATUS: Final = "status"
RECORD_FLAGS: Final = "flags"
RECORD_DETAILS: Final = "details"
RECORD_ATTEMPTS: Final = "attempts"
RECORD_CONTENT_TYPE: Final = "content_type"
# Microseconds from the request's first byte (Envoy's DS_RX_BEG) to each time point.
RECORD_FIRST_UPSTREAM_BYTE_US: Final = "first_upstream_byte_us"  # US_RX_BEG: headers
RECORD_FIRST_UPSTREAM_BODY_US: Final = "first_upstream_body_us"  # US_RX_BODY_BEG: TTFT
RECORD_FIRST_DOWNSTREAM_BYTE_US: Final = "first_downstream_byte_us"  # DS_TX_BEG
RECORD_LAST_DOWNSTREAM_BYTE_US: Final = "last_downstream_byte_us"  # DS_TX_END
# Microseconds from the answering attempt's request going out to the provider's first
# body byte (US_TX_BEG to US_RX_BODY_BEG): the provider's own time to first token, without
# the gateway's routing, queueing or earlier attempts.
RECORD_PROVIDER_TTFT_US: Final = "provider_ttft_us"
# The request's id, the same in each of its records: made by Envoy from values no client
# sets (not x-request-id, which a sidecar keeps from its client); and the record's
# access-log type: LOG_TYPE_IN_FLIGHT for one sent while the request still runs, every
# IN_FLIGHT_FLUSH_MS (docs/fast-lane.md, "The auto lane"), else the request's end.
RECORD_STREAM_ID: Final = "stream_id"
RECORD_LOG_TYPE: Final = "log_type"
LOG_TYPE_IN_FLIGHT: Final = "DownstreamPeriodic"
IN_FLIGHT_FLUSH_MS: Final = 500
# Set on a reserved request whose usage the usage observer charges (a large JSON answer):
# the value is USAGE_VIA_OBSERVER. The request record charges every other reservation
# (docs/admission.md, "Reserve, then reconcile").
META_USAGE_VIA: Final = "usage_via"
USAGE_VIA_OBSERVER: Final = "observer"
# Set (USAGE_INJECTED_TRUE) on a stream whose body the routing stage gave
# `stream_options.include_usage` the client did not ask for: Envoy's stream usage filter
# cuts the usage event out of what the client receives (xds/translate/stream_usage.py).
META_USAGE_INJECTED: Final = "usage_injected"
USAGE_INJECTED_TRUE: Final = "true"
# Set by the routing stage (in the fast lane, by Envoy's model reader) on every request it
# routes: who reads the usage.
# USAGE_BY_LOG: a small JSON answer (json_to_metadata reads its usage); USAGE_BY_STREAM: an
# event stream (sse_to_metadata reads its usage event); USAGE_BY_STREAM_CHUNKS: an event
# stream whose chunks a Lua filter also reads, to cut the usage event the gateway asked for
# or to count content events for a reservation; all reach the ext_proc servers in the
# request record. USAGE_BY_OBSERVER: a large JSON answer with a reservation (the usage
# observer reads it in Python); USAGE_UNREAD: nobody reads. Stripped before routing when a
# client sends it, and before a provider sees it.
USAGE_HEADER: Final = "x-sluicegate-usage"
USAGE_BY_LOG: Final = "log"
USAGE_BY_STREAM: Final = "stream"
USAGE_BY_STREAM_CHUNKS: Final = "stream-chunks"
USAGE_BY_OBSERVER: Final = "observer"
USAGE_UNREAD: Final = "none"
USAGE_READERS: Final = (
    USAGE_BY_LOG, USAGE_BY_STREAM, USAGE_BY_STREAM_CHUNKS, USAGE_BY_OBSERVER, USAGE_UNREAD
)  # fmt: skip
# How a request's usage reader is chosen (filters/usage_reader.py, and Envoy's model
# reader, xds/translate/model_reader.py): the endpoints whose JSON answers carry `usage`,
# the members that cap the output tokens (the first present counts) or ask for log
# probabilities, and the largest allowance of a JSON answer Envoy reads (about 16 KB of
# text at worst, under a millisecond of Envoy's worker).
GENERATION_ENDPOINTS: Final = ("/chat/completions", "/completions", "/responses")
# Endpoints that take `stream_options.include_usage` (the Responses API always reports
# it), and the member the gateway splices in to ask a stream's usage for the client.
STREAM_USAGE_ENDPOINTS: Final = ("/chat/completions", "/completions")
INCLUDE_USAGE_MEMBER: Final = '"stream_options":{"include_usage":true},'
MAX_TOKENS_MEMBERS: Final = ("max_completion_tokens", "max_tokens", "max_output_tokens")
LOGPROBS_MEMBERS: Final = ("logprobs", "top_logprobs")
# Members sent to the model as input, which token estimates count (filters/estimate.py).
# `instructions` is the Responses API's system prompt; tools and functions are rendered
# into the prompt by providers.
PROMPT_MEMBERS: Final = ("messages", "prompt", "input", "instructions", "tools", "functions")
# Every top-level member the gateway reads from a request body (in both lanes): one that
# occurs twice is refused (a provider's parser would read the last, the gateway the first).
BODY_READ_MEMBERS: Final = (
    "model",
    "stream",
    "stream_options",
    "n",
    *MAX_TOKENS_MEMBERS,
    *PROMPT_MEMBERS,
    *LOGPROBS_MEMBERS,
)
# The most choices (`n`) a request may ask for: OpenAI's limit.
MAX_N: Final = 128
LOG_MAX_OUTPUT_TOKENS: Final = 4096
# Set (value "true") by the routing stage, with the model header, on a request whose body
# has `"stream": true`: it selects the model route's stream twin, whose attempts wait
# timeouts.first_token (xds/translate/streams.py). Stripped before routing when a client
# sends it; the twin removes it before a provider sees it.
STREAM_HEADER: Final = "x-sluicegate-stream"
# Envoy's json_to_metadata and sse_to_metadata filters write an answer's usage members
# here, and the stream usage filter its count of content events (USAGE_CONTENT_EVENTS);
# the request record carries them to the ext_proc servers.
USAGE_METADATA_NAMESPACE: Final = "sluicegate.usage"
USAGE_MEMBERS: Final = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
USAGE_CONTENT_EVENTS: Final = "content_events"
# A usage count above this is garbage, not usage (a provider's, or a client's text).
MAX_USAGE_TOKENS: Final = 10**9


def metadata_field(namespace: str, key: str) -> str:
    """The record field carrying dynamic metadata `key` of `namespace`: Envoy's own name
    for it (`%DYNAMIC_METADATA(<namespace>:<key>)%`), which formats the value's text: a
    string as it is, a number or a boolean as JSON, "-" for none."""
    return f"{namespace}:{key}"


# The request's dynamic metadata the record reads, one field a key. Not each namespace as
# one JSON object: Envoy's JSON printer cost its worker 2 to 11 µs a request more, before
# the response's last bytes leave (benchmarks/RESULTS.md, "The record's metadata, key by
# key").
# The model comes last: it is the only value holding client text (an unrouted model may
# hold a newline), and a split that stops before it leaves whatever it holds in it. The
# usage members come just before it: a provider may send one as text, with a newline,
# which can then garble only that request's usage (the provider's own word anyway) and
# model (which the record then drops: records/record.py).
RECORD_USAGE_FIELDS: Final = tuple(
    metadata_field(USAGE_METADATA_NAMESPACE, key) for key in (*USAGE_MEMBERS, USAGE_CONTENT_EVENTS)
)
RECORD_METADATA_FIELDS: Final = (
    *(
        metadata_field(METADATA_NAMESPACE, key)
        for key in (
            META_TENANT,
            META_KEY_NAME,
            META_PRIORITY,
            META_SCENARIO,
            META_SCENARIO_ASKED,
            META_ROUTE,
            META_ERROR_CODE,
            META_QUEUE_MS,
            META_STREAM,
            META_RESERVATION,
            META_ESTIMATE_INPUT,
            META_ESTIMATE_OUTPUT,
            META_USAGE_VIA,
            META_AUTO_LANE,
            META_CHARGED_TENANT,
        )
    ),
    *RECORD_USAGE_FIELDS,
    metadata_field(METADATA_NAMESPACE, META_MODEL),
)


def record_metadata_keys(namespace: str) -> tuple[tuple[str, str], ...]:
    """(field, key) of each key of `namespace` the record carries (RECORD_METADATA_FIELDS)."""
    prefix = metadata_field(namespace, "")
    return tuple(
        (field, field[len(prefix) :])
        for field in RECORD_METADATA_FIELDS
        if field.startswith(prefix)
    )


# The record's fields in the order its body carries them.
RECORD_LAYOUT: Final = (
    RECORD_STREAM_ID,
    RECORD_ROUTE,
    RECORD_PROVIDER,
    RECORD_STATUS,
    RECORD_FLAGS,
    RECORD_DETAILS,
    RECORD_ATTEMPTS,
    RECORD_CONTENT_TYPE,
    RECORD_FIRST_UPSTREAM_BYTE_US,
    RECORD_FIRST_UPSTREAM_BODY_US,
    RECORD_FIRST_DOWNSTREAM_BYTE_US,
    RECORD_LAST_DOWNSTREAM_BYTE_US,
    RECORD_PROVIDER_TTFT_US,
    *RECORD_METADATA_FIELDS,
)
# A JSON media type (application/json, application/problem+json …, any parameters such as
# charset), case-insensitive; RE2 and Python `re` read it alike. Envoy's json_to_metadata
# reads usage from such answers, the usage observer parses them, and a provider's error
# answer of any other type is wrapped in OpenAI's error JSON.
JSON_MEDIA_TYPE_REGEX: Final = r"(?i)\s*application/([a-z0-9.+-]*\+)?json\s*(;.*)?"
# response header -> dynamic metadata key holding its value
RATELIMIT_HEADERS: Final = (
    ("x-ratelimit-limit-requests", "ratelimit_limit_requests"),
    ("x-ratelimit-remaining-requests", "ratelimit_remaining_requests"),
    ("x-ratelimit-reset-requests", "ratelimit_reset_requests"),
    ("x-ratelimit-limit-tokens", "ratelimit_limit_tokens"),
    ("x-ratelimit-remaining-tokens", "ratelimit_remaining_tokens"),
    ("x-ratelimit-reset-tokens", "ratelimit_reset_tokens"),
)

# An Envoy's node metadata (namespace METADATA_NAMESPACE), written by its bootstrap: the
# path of sluicegate's native filters library on Envoy's machine, for a control plane
# whose native_filters.module is `node` to serve that Envoy (docs/native-filters.md).
NODE_NATIVE_MODULE: Final = "native_module"

# Static clusters declared in the bootstrap (never pushed over xDS).
XDS_CLUSTER: Final = "sluicegate_xds"
EXT_PROC_CLUSTER: Final = "sluicegate_ext_proc"  # the routing stage: one stream per request
# The same ext_proc servers for the stages that open streams of their own (the usage
# observer, the usage access log, the attempt stage). A cluster of their own keeps
# Envoy's round robin over the routing cluster one step per request: shared, observer
# streams would take every other turn, and with two replicas every routing stream could
# land on one of them.
EXT_PROC_SIDE_CLUSTER: Final = "sluicegate_ext_proc_side"

# Endpoint metadata (namespace METADATA_NAMESPACE) carrying per-provider facts to
# per-attempt filters.
META_PROVIDER: Final = "provider"
META_PATH_PREFIX: Final = "path_prefix"
META_MODEL_MAP: Final = "model_map"

# Envoy's attribute carrying the chosen host's metadata to an upstream ext_proc.
UPSTREAM_HOST_METADATA_ATTRIBUTE: Final = "xds.upstream_host_metadata"

# SDS name of a provider's upstream key (`sluicegate-key-<provider>`); the Secret holds
# `Bearer <key>`. Keys never appear in clusters, routes or endpoint metadata.
KEY_SECRET_PREFIX: Final = "sluicegate-key-"


# ----- model listings: Envoy serves them (direct responses); ext_proc serves a tenant's --


def model_object(model: str) -> dict[str, Any]:
    """OpenAI's model object; `created` is unknown to a gateway, 0 keeps output stable."""
    return {"id": model, "object": "model", "created": 0, "owned_by": "sluicegate"}


def models_list_body(models: Iterable[str]) -> bytes:
    """OpenAI's `GET /v1/models` answer for `models`, sorted and de-duplicated."""
    data = [model_object(model) for model in sorted(set(models))]
    return json.dumps({"object": "list", "data": data}, separators=(",", ":")).encode()


def model_body(model: str) -> bytes:
    """OpenAI's `GET /v1/models/{model}` answer."""
    return json.dumps(model_object(model), separators=(",", ":")).encode()


# ----- latency-aware routing (docs/latency-routing.md) ------------------------------------

# Endpoint metadata (namespace METADATA_NAMESPACE) on the providers of a `routing: latency`
# route: the access-log filter of the latency record log sends only the requests whose
# answering host carries it, to the control plane (cluster XDS_CLUSTER).
META_ROUTING: Final = "routing"
ROUTING_LATENCY: Final = "latency"
LATENCY_LOG_NAME: Final = "sluicegate-latency-2"
# The latency log's fields, in order: what latency-aware routing reads (which route and
# provider, whether it failed, its time to first token, its duration and, for time per
# output token, whether it streamed and its output tokens); the rest stays off the wire.
LATENCY_LAYOUT: Final = (
    RECORD_ROUTE,
    RECORD_PROVIDER,
    RECORD_STATUS,
    RECORD_FLAGS,
    RECORD_ATTEMPTS,
    RECORD_CONTENT_TYPE,
    RECORD_FIRST_UPSTREAM_BODY_US,
    RECORD_LAST_DOWNSTREAM_BYTE_US,
    RECORD_PROVIDER_TTFT_US,
    *RECORD_USAGE_FIELDS,
)
# ----- the auto lane (docs/fast-lane.md, "The auto lane") ---------------------------------

# The records of `auto` tenants' requests (metadata META_AUTO_LANE) while they run, to
# the ext_proc servers: what the exact lane's charges and the usage notes read (which
# request and whether it still runs, whether it failed, the tenant, key and estimate in
# the metadata, the usage, and for a stream without usage its counted events; the
# details tell the fast lane's own refusal).
LANE_LOG_NAME: Final = "sluicegate-lane-2"
LANE_LAYOUT: Final = (
    RECORD_STREAM_ID,
    RECORD_LOG_TYPE,
    RECORD_STATUS,
    RECORD_DETAILS,
    RECORD_CONTENT_TYPE,
    *RECORD_METADATA_FIELDS,
)
# What the ext_proc servers tell the control plane of an `auto` tenant's request, one
# note a record of it (lanes/notes.py), sent to the control plane's LogsService as the
# body of a LogRecord, laid out as the record logs are (record_body).
LANE_USAGE_LOG_NAME: Final = "sluicegate-lane-usage"
NOTE_TENANT: Final = "tenant"
NOTE_KEY_NAME: Final = "key_name"
NOTE_STREAM_ID: Final = RECORD_STREAM_ID
NOTE_KIND: Final = "kind"  # lanes/notes.py: running, ended, failed or refused
NOTE_INPUT_TOKENS: Final = "input_tokens"
NOTE_OUTPUT_TOKENS: Final = "output_tokens"
LANE_USAGE_LAYOUT: Final = (
    NOTE_TENANT,
    NOTE_KEY_NAME,
    NOTE_STREAM_ID,
    NOTE_KIND,
    NOTE_INPUT_TOKENS,
    NOTE_OUTPUT_TOKENS,
)
_LAYOUTS: Final = {
    RECORD_LOG_NAME: RECORD_LAYOUT,
    LATENCY_LOG_NAME: LATENCY_LAYOUT,
    LANE_LOG_NAME: LANE_LAYOUT,
    LANE_USAGE_LOG_NAME: LANE_USAGE_LAYOUT,
}


def record_body(log_name: str, fields: Mapping[str, str]) -> str:
    """A record log's body (docs/metrics.md, "The record"): the log's name, then each
    field of its layout, one per line ("-" for one not given). The translator writes it
    with Envoy's format strings as the fields; Envoy sends it with their values.

    One string, not an attribute per field: Envoy's OpenTelemetry logger costs a few µs
    per attribute on the worker, before the response's last bytes leave (RESULTS.md)."""
    return "\n".join((log_name, *(fields.get(key, "-") for key in _LAYOUTS[log_name])))


def record_fields(body: str) -> dict[str, str]:
    """The fields of a record log's body, by key; {} for a body of no known log. No
    field but the last can hold a newline: the header values, codes, names and numbers
    Envoy formats cannot (but a provider's usage member as text: RECORD_METADATA_FIELDS)."""
    log_name, _, rest = body.partition("\n")
    layout = _LAYOUTS.get(log_name)
    if layout is None:
        return {}
    return dict(zip(layout, rest.split("\n", len(layout) - 1), strict=False))
