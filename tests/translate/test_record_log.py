"""The request record's access log: on every listener, every request, in a form Envoy 1.40
reads without a deprecation warning (docs/metrics.md, "The record")."""

from __future__ import annotations

from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import json_format
from xds.type.v3 import typed_struct_pb2

from sluicegate import wire
from sluicegate.xds.translate import LISTENER, translate
from sluicegate.xds.translate.record_log import OTEL_ACCESS_LOG, OTEL_CONFIG_TYPE_URL

from .cases import model_of


def _record_logs(case: str) -> list[dict[str, object]]:
    configs = []
    for listener in translate(model_of(case))[LISTENER]:
        assert isinstance(listener, listener_pb2.Listener)
        manager = hcm_pb2.HttpConnectionManager()
        assert listener.filter_chains[0].filters[-1].typed_config.Unpack(manager)
        for log in manager.access_log:
            if log.name == OTEL_ACCESS_LOG:
                assert not log.HasField("filter"), "every request is recorded"
                typed = typed_struct_pb2.TypedStruct()
                assert log.typed_config.Unpack(typed)
                assert typed.type_url == OTEL_CONFIG_TYPE_URL
                configs.append(json_format.MessageToDict(typed.value))
    return configs


def test_every_listener_records_every_request_with_or_without_admission() -> None:
    for case in ("single_provider", "token_limits", "several_listeners"):
        configs = _record_logs(case)
        assert len(configs) == len(model_of(case).listeners), case
        for config in configs:
            # In common_config: Envoy 1.40 ignores a top-level flush interval (record_log.py).
            common = config["common_config"]
            assert not {"log_name", "grpc_service", "buffer_flush_interval"} & set(config)
            assert common["log_name"] == wire.RECORD_LOG_NAME
            assert common["grpc_service"] == {
                "envoy_grpc": {"cluster_name": wire.EXT_PROC_SIDE_CLUSTER}
            }
            assert common["buffer_flush_interval"] == "0.100s"


def test_the_record_carries_the_time_to_first_token_as_the_first_body_byte() -> None:
    (config,) = _record_logs("single_provider")
    attributes = wire.record_fields(config["body"]["string_value"])  # type: ignore[index]
    assert list(attributes) == list(wire.RECORD_LAYOUT)
    assert attributes[wire.RECORD_FIRST_UPSTREAM_BODY_US] == (
        "%COMMON_DURATION(DS_RX_BEG:US_RX_BODY_BEG:us)%"
    )
    # The metadata a key a field, never a whole namespace as JSON (wire.metadata_field).
    tenant = wire.metadata_field(wire.METADATA_NAMESPACE, wire.META_TENANT)
    assert attributes[tenant] == "%DYNAMIC_METADATA(sluicegate:tenant)%"
    prompt = wire.metadata_field(wire.USAGE_METADATA_NAMESPACE, "prompt_tokens")
    assert attributes[prompt] == "%DYNAMIC_METADATA(sluicegate.usage:prompt_tokens)%"
    for namespace in (wire.METADATA_NAMESPACE, wire.USAGE_METADATA_NAMESPACE):
        assert not any(f"({namespace})" in value for value in attributes.values())
