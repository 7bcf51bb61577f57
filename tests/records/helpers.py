"""Log records as Envoy's OpenTelemetry access log sends them, and a small model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from sluicegate import wire
from sluicegate.config import Config
from sluicegate.model import Gateway, build_model
from sluicegate.testing import metadata_fields, usage_fields

MODEL = """
version: 1
listeners: [{name: main, port: 10000}]
admission:
  priority_classes:
    - {name: interactive, max_queue: 8, max_wait: 1s}
    - {name: batch, max_queue: 8, max_wait: 1s}
  default_priority: batch
tenants:
  - name: acme
    keys:
      - name: ci
        hash: "sha256:00112233445566778899aabbccddeeff:\\
          0000000000000000000000000000000000000000000000000000000000000000"
providers:
  - {name: alpha, base_url: "http://127.0.0.1:18081/v1", model_map: {m: m-alpha}}
  - {name: beta, base_url: "http://127.0.0.1:18082/v1"}
routes:
  - {name: chat, models: [m, m2], backends: [{provider: alpha}, {provider: beta}]}
"""


def gateway(scenarios: list[str] | None = None) -> Gateway:
    document = yaml.safe_load(MODEL)
    if scenarios is not None:
        document["scenarios"] = scenarios
    return build_model(Config.model_validate(document), {})


def log_record(
    fields: Mapping[str, str], time_unix_nano: int = 0, log_name: str = wire.RECORD_LOG_NAME
) -> Any:
    """As Envoy sends it: the fields in the record body (a field not given is "-")."""
    body = common_pb2.AnyValue(string_value=wire.record_body(log_name, fields))
    return logs_pb2.LogRecord(time_unix_nano=time_unix_nano, body=body)


# The metadata of streamed(): what the routing stage wrote.
STREAMED_META: Mapping[str, object] = {
    wire.META_TENANT: "acme",
    wire.META_KEY_NAME: "ci",
    wire.META_MODEL: "m",
    wire.META_PRIORITY: "interactive",
    wire.META_SCENARIO: "default",
    wire.META_QUEUE_MS: 12.5,
    wire.META_STREAM: "true",
    wire.META_RESERVATION: "r-1",
}


def streamed(**overrides: str) -> dict[str, str]:
    """The attributes of a successful stream through route chat to alpha, with usage."""
    attributes = {
        wire.RECORD_ROUTE: "chat",
        wire.RECORD_PROVIDER: "alpha",
        wire.RECORD_STATUS: "200",
        wire.RECORD_FLAGS: "-",
        wire.RECORD_DETAILS: "via_upstream",
        wire.RECORD_ATTEMPTS: "1",
        wire.RECORD_CONTENT_TYPE: "text/event-stream",
        wire.RECORD_FIRST_UPSTREAM_BYTE_US: "1500",
        wire.RECORD_FIRST_UPSTREAM_BODY_US: "300000",
        wire.RECORD_FIRST_DOWNSTREAM_BYTE_US: "1600",
        wire.RECORD_LAST_DOWNSTREAM_BYTE_US: "680000",
        wire.RECORD_PROVIDER_TTFT_US: "295000",
        **metadata_fields(STREAMED_META),
        **usage_fields({"prompt_tokens": 7, "completion_tokens": 20}),
    }
    attributes.update(overrides)
    return attributes


def export_of(*records: Any) -> Any:
    return logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[
            logs_pb2.ResourceLogs(
                instrumentation_library_logs=[logs_pb2.InstrumentationLibraryLogs(logs=records)]
            )
        ]
    )
