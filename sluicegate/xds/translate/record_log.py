"""The request record: one OpenTelemetry log record per request, sent by Envoy to the
ext_proc servers (docs/metrics.md, "The record").

Envoy's OpenTelemetry access logger, not the gRPC access log that carries usage today
(usage.py): only format-string loggers can carry `%COMMON_DURATION(...US_RX_BODY_BEG...)%`,
the first *body* byte from the provider, which is the time to first token even when a
provider sends its headers early (vLLM); the gRPC log's fields count from the headers.
Every request is logged (no filter), admitted or refused; entries are batched and sent
every LOG_FLUSH_MS (or once LOG_BUFFER_BYTES are held) as one unary `Export` per flush.

Envoy 1.40 deprecates the logger's `common_config` in favour of top-level `grpc_service`,
`log_name` and `buffer_flush_interval`, but its gRPC logger ignores the top-level
`buffer_flush_interval` and flushes every second (measured: exports 0.995 s apart with
it, 0.1 s apart with it in `common_config`; benchmarks/RESULTS.md, "The record's flush
interval"). So the transport settings stay in `common_config`, the one deprecated field
sluicegate pushes (tests/envoy/test_no_deprecated_fields.py allows it alone). The venv's
protos (xds-protos 1.85) lack the newer top-level fields (`disable_builtin_labels`,
`body`'s neighbours), so the config goes as an `xds.type.v3.TypedStruct` of the newer
message, which Envoy reads as if typed.

A second logger of the same kind, only on listeners of a config with a `routing: latency`
route, sends the few fields latency-aware routing reads to the control plane (the
xDS cluster, whose gRPC server also serves the LogsService), and only for requests a
latency route's provider answered: a CEL filter on that host's endpoint metadata
(wire.META_ROUTING, endpoints.py). Both loggers are built from RECORD_FORMATS by one
function, so a field's format string is written once (docs/latency-routing.md).

On listeners of a config with an `auto` tenant, Envoy also logs every request still
running every wire.IN_FLIGHT_FLUSH_MS (the HCM's periodic flush): the lane log sends
those records of auto tenants' requests (metadata wire.META_AUTO_LANE, written by the
model reader in the fast lane and by the routing stage in the exact lane) to the ext_proc
servers, which so charge and note a long request while it runs, not only at its end;
every other log takes ends only. The ext_proc servers send the control plane's lane
steering a usage note of each auto tenant's record (sluicegate.lanes; docs/fast-lane.md,
"The auto lane").
"""

from __future__ import annotations

from typing import Final

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.data.accesslog.v3 import accesslog_pb2 as accesslog_data_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.type.matcher.v3 import metadata_pb2, value_pb2
from google.protobuf import wrappers_pb2
from xds.type.v3 import typed_struct_pb2

from sluicegate import wire

from ._proto import pack, struct

# How long Envoy may hold finished requests' records before sending them: a reservation
# is reconciled at most this long after its response ended.
LOG_FLUSH_MS: Final = 100
# How many bytes of records Envoy may hold before it sends them sooner: enough for a busy
# worker's LOG_FLUSH_MS (about 3,500 records), so a batch goes by time. At Envoy's 16 KiB
# a worker at full load sent an Export every few milliseconds, and the records cost it
# twice what they cost in batches of up to this size (benchmarks/RESULTS.md, "The
# record's batches"). The ext_proc servers take messages far larger (filters/server.py).
LOG_BUFFER_BYTES: Final = 1 << 20
OTEL_ACCESS_LOG: Final = "envoy.access_loggers.open_telemetry"
OTEL_CONFIG_TYPE_URL: Final = (
    "type.googleapis.com/"
    "envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig"
)


def _since_start_us(point: str) -> str:
    """Microseconds from the request's first byte to Envoy's time point `point`."""
    return _between_us("DS_RX_BEG", point)


def _between_us(start: str, end: str) -> str:
    """Microseconds between two of Envoy's time points."""
    return f"%COMMON_DURATION({start}:{end}:us)%"


# Field -> Envoy format string. A value Envoy does not have is formatted as "-".
RECORD_FORMATS: Final = {
    # Unique per Envoy host, connection and start (to the nanosecond); %STREAM_ID% is
    # x-request-id, which a client may set (a sidecar keeps it: use_remote_address false).
    wire.RECORD_STREAM_ID: "%HOSTNAME%/%CONNECTION_ID%/%START_TIME(%s.%9f)%",
    wire.RECORD_LOG_TYPE: "%ACCESS_LOG_TYPE%",
    wire.RECORD_ROUTE: "%ROUTE_NAME%",
    # The endpoint metadata of the host that answered the last attempt (endpoints.py).
    wire.RECORD_PROVIDER: f"%UPSTREAM_METADATA({wire.METADATA_NAMESPACE}:{wire.META_PROVIDER})%",
    wire.RECORD_STATUS: "%RESPONSE_CODE%",
    wire.RECORD_FLAGS: "%RESPONSE_FLAGS%",
    wire.RECORD_DETAILS: "%RESPONSE_CODE_DETAILS%",
    wire.RECORD_ATTEMPTS: "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
    wire.RECORD_CONTENT_TYPE: "%RESP(CONTENT-TYPE)%",
    wire.RECORD_FIRST_UPSTREAM_BYTE_US: _since_start_us("US_RX_BEG"),
    wire.RECORD_FIRST_UPSTREAM_BODY_US: _since_start_us("US_RX_BODY_BEG"),
    wire.RECORD_FIRST_DOWNSTREAM_BYTE_US: _since_start_us("DS_TX_BEG"),
    wire.RECORD_LAST_DOWNSTREAM_BYTE_US: _since_start_us("DS_TX_END"),
    # The answering provider's own time to first token: neither the gateway's queue nor
    # an earlier attempt on another provider counts in it.
    wire.RECORD_PROVIDER_TTFT_US: _between_us("US_TX_BEG", "US_RX_BODY_BEG"),
    # Each metadata key the record reads, as its value's text (wire.metadata_field).
    **{field: f"%DYNAMIC_METADATA({field})%" for field in wire.RECORD_METADATA_FIELDS},
}


# Requests whose answering host is a `routing: latency` route's provider. A request no
# host answered has no host metadata: the expression errs, and Envoy logs nothing for it.
LATENCY_FILTER_EXPRESSION: Final = (
    f"xds.upstream_host_metadata.filter_metadata['{wire.METADATA_NAMESPACE}']"
    f"['{wire.META_ROUTING}'] == '{wire.ROUTING_LATENCY}'"
)
CEL_ACCESS_LOG_FILTER: Final = "envoy.access_loggers.extension_filters.cel"


def record_access_log(*, in_flight: bool = False) -> accesslog_pb2.AccessLog:
    """Every request's record, over gRPC to the ext_proc servers (the side cluster),
    batched every LOG_FLUSH_MS; at its end only when Envoy also logs requests in flight."""
    log = _otel_access_log(wire.RECORD_LOG_NAME, wire.EXT_PROC_SIDE_CLUSTER, ids=in_flight)
    if in_flight:
        log.filter.CopyFrom(_ends())
    return log


def latency_access_log(*, in_flight: bool = False) -> accesslog_pb2.AccessLog:
    """The records of requests a `routing: latency` route's provider answered, with only
    the fields of wire.LATENCY_LAYOUT, to the control plane's LogsService over the xDS
    cluster; at their end only."""
    log = _otel_access_log(wire.LATENCY_LOG_NAME, wire.XDS_CLUSTER)
    latency = _cel(LATENCY_FILTER_EXPRESSION)
    log.filter.CopyFrom(_all_of(_ends(), latency) if in_flight else latency)
    return log


def lane_access_logs() -> list[accesslog_pb2.AccessLog]:
    """The records of `auto` tenants' requests while they run, in either lane, with only
    the fields of wire.LANE_LAYOUT, to the ext_proc servers (their ends come with the
    record log)."""
    to_ext_proc = _otel_access_log(wire.LANE_LOG_NAME, wire.EXT_PROC_SIDE_CLUSTER)
    to_ext_proc.filter.CopyFrom(_all_of(_auto_tenants(), _in_flight()))
    return [to_ext_proc]


def _cel(expression: str) -> accesslog_pb2.AccessLogFilter:
    """The requests the CEL `expression` holds for."""
    return accesslog_pb2.AccessLogFilter(
        extension_filter=accesslog_pb2.ExtensionFilter(
            name=CEL_ACCESS_LOG_FILTER,
            typed_config=pack(cel_pb2.ExpressionFilter(expression=expression)),
        )
    )


def _auto_tenants() -> accesslog_pb2.AccessLogFilter:
    """Requests of `auto` tenants (metadata wire.META_AUTO_LANE true)."""
    return _metadata(wire.META_AUTO_LANE, value_pb2.ValueMatcher(bool_match=True))


def _metadata(key: str, value: value_pb2.ValueMatcher) -> accesslog_pb2.AccessLogFilter:
    """Requests whose `sluicegate` metadata `key` matches `value` (Envoy's own match,
    cheaper than CEL); a request without the key does not."""
    return accesslog_pb2.AccessLogFilter(
        metadata_filter=accesslog_pb2.MetadataFilter(
            matcher=metadata_pb2.MetadataMatcher(
                filter=wire.METADATA_NAMESPACE,
                path=[metadata_pb2.MetadataMatcher.PathSegment(key=key)],
                value=value,
            ),
            match_if_key_not_found=wrappers_pb2.BoolValue(value=False),
        )
    )


_IN_FLIGHT: Final = accesslog_data_pb2.AccessLogType.DownstreamPeriodic


def _in_flight() -> accesslog_pb2.AccessLogFilter:
    """Records Envoy sends while a request runs (wire.LOG_TYPE_IN_FLIGHT)."""
    return accesslog_pb2.AccessLogFilter(
        log_type_filter=accesslog_pb2.LogTypeFilter(types=[_IN_FLIGHT])
    )


def _ends() -> accesslog_pb2.AccessLogFilter:
    """Every record but those sent while a request runs."""
    return accesslog_pb2.AccessLogFilter(
        log_type_filter=accesslog_pb2.LogTypeFilter(types=[_IN_FLIGHT], exclude=True)
    )


def _all_of(*filters: accesslog_pb2.AccessLogFilter) -> accesslog_pb2.AccessLogFilter:
    return accesslog_pb2.AccessLogFilter(and_filter=accesslog_pb2.AndFilter(filters=filters))


def _otel_access_log(log_name: str, cluster: str, *, ids: bool = True) -> accesslog_pb2.AccessLog:
    """An OpenTelemetry access logger sending each request's record body of `log_name`
    (wire.record_body, with RECORD_FORMATS) to `cluster`, batched every LOG_FLUSH_MS.
    Without `ids` the request id is "-": only the auto lane matches a request's records,
    and Envoy would format it on every request's worker for nothing."""
    formats = RECORD_FORMATS if ids else {**RECORD_FORMATS, wire.RECORD_STREAM_ID: "-"}
    config = {
        # Where Envoy 1.40 reads the flush interval (module docstring).
        "common_config": {
            "log_name": log_name,
            "grpc_service": {"envoy_grpc": {"cluster_name": cluster}},
            "buffer_flush_interval": f"{LOG_FLUSH_MS / 1000:.3f}s",
            "buffer_size_bytes": LOG_BUFFER_BYTES,
            "transport_api_version": "V3",
        },
        # The node, zone and cluster labels on every export: nobody reads them.
        "disable_builtin_labels": True,
        "body": {"string_value": wire.record_body(log_name, formats)},
    }
    typed = typed_struct_pb2.TypedStruct(type_url=OTEL_CONFIG_TYPE_URL, value=struct(config))
    return accesslog_pb2.AccessLog(name=OTEL_ACCESS_LOG, typed_config=pack(typed))
