"""The request record: one OpenTelemetry log record per request, sent by Envoy to the
ext_proc servers (docs/metrics.md, "The record").

Envoy's OpenTelemetry access logger, not the gRPC access log that carries usage today
(usage.py): only format-string loggers can carry `%COMMON_DURATION(...US_RX_BODY_BEG...)%`,
the first *body* byte from the provider, which is the time to first token even when a
provider sends its headers early (vLLM); the gRPC log's fields count from the headers.
Every request is logged (no filter), admitted or refused; entries are batched and sent
every LOG_FLUSH_MS as one unary `Export` per flush.

Envoy 1.40 deprecates the logger's `common_config` in favour of top-level `grpc_service`,
`log_name` and `buffer_flush_interval`, which the venv's protos (xds-protos 1.85) lack, so
the config goes as an `xds.type.v3.TypedStruct` of the newer message: Envoy reads it as
if typed, and warns about no deprecated field (tests/envoy/test_no_deprecated_fields.py).
"""

from __future__ import annotations

from typing import Final

from envoy.config.accesslog.v3 import accesslog_pb2
from xds.type.v3 import typed_struct_pb2

from sluicegate import wire

from ._proto import pack, struct
from .usage import LOG_FLUSH_MS

OTEL_ACCESS_LOG: Final = "envoy.access_loggers.open_telemetry"
OTEL_CONFIG_TYPE_URL: Final = (
    "type.googleapis.com/"
    "envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig"
)


def _since_start_us(point: str) -> str:
    """Microseconds from the request's first byte to Envoy's time point `point`."""
    return f"%COMMON_DURATION(DS_RX_BEG:{point}:us)%"


# Attribute -> Envoy format string. A value Envoy does not have is formatted as "-".
RECORD_ATTRIBUTES: Final = (
    (wire.RECORD_ROUTE, "%ROUTE_NAME%"),
    # The endpoint metadata of the host that answered the last attempt (endpoints.py).
    (wire.RECORD_PROVIDER, f"%UPSTREAM_METADATA({wire.METADATA_NAMESPACE}:{wire.META_PROVIDER})%"),
    (wire.RECORD_STATUS, "%RESPONSE_CODE%"),
    (wire.RECORD_FLAGS, "%RESPONSE_FLAGS%"),
    (wire.RECORD_DETAILS, "%RESPONSE_CODE_DETAILS%"),
    (wire.RECORD_ATTEMPTS, "%UPSTREAM_REQUEST_ATTEMPT_COUNT%"),
    (wire.RECORD_CONTENT_TYPE, "%RESP(CONTENT-TYPE)%"),
    (wire.RECORD_FIRST_UPSTREAM_BYTE_US, _since_start_us("US_RX_BEG")),
    (wire.RECORD_FIRST_UPSTREAM_BODY_US, _since_start_us("US_RX_BODY_BEG")),
    (wire.RECORD_FIRST_DOWNSTREAM_BYTE_US, _since_start_us("DS_TX_BEG")),
    (wire.RECORD_LAST_DOWNSTREAM_BYTE_US, _since_start_us("DS_TX_END")),
    (wire.RECORD_METADATA, f"%DYNAMIC_METADATA({wire.METADATA_NAMESPACE})%"),
    (wire.RECORD_USAGE, f"%DYNAMIC_METADATA({wire.USAGE_METADATA_NAMESPACE})%"),
)


def record_access_log() -> accesslog_pb2.AccessLog:
    """Every request's record, over gRPC to the ext_proc servers (the side cluster, like the
    usage log), batched every LOG_FLUSH_MS."""
    config = {
        "log_name": wire.RECORD_LOG_NAME,
        "grpc_service": {"envoy_grpc": {"cluster_name": wire.EXT_PROC_SIDE_CLUSTER}},
        "buffer_flush_interval": f"{LOG_FLUSH_MS / 1000:.3f}s",
        # The node, zone and cluster labels on every export: nobody reads them.
        "disable_builtin_labels": True,
        "attributes": {
            "values": [
                {"key": key, "value": {"string_value": fmt}} for key, fmt in RECORD_ATTRIBUTES
            ]
        },
    }
    typed = typed_struct_pb2.TypedStruct(type_url=OTEL_CONFIG_TYPE_URL, value=struct(config))
    return accesslog_pb2.AccessLog(name=OTEL_ACCESS_LOG, typed_config=pack(typed))
