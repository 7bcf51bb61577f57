"""What latency routing changes in Envoy's resources: a second record log (only with a
`routing: latency` route), the endpoints' tag and the learned weights, as data."""

from __future__ import annotations

from typing import Any

from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import json_format
from xds.type.v3 import typed_struct_pb2

from sluicegate import wire
from sluicegate.xds.translate import ENDPOINT, LISTENER, RouteMemo, translate
from sluicegate.xds.translate.record_log import RECORD_FORMATS

from .helpers import document, gateway


def _logs(resources: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every OpenTelemetry access log of the first listener: its config and its filter."""
    listener = resources[LISTENER][0]
    assert isinstance(listener, listener_pb2.Listener)
    manager = hcm_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[-1].typed_config.Unpack(manager)
    found = []
    for log in manager.access_log:
        typed = typed_struct_pb2.TypedStruct()
        if log.typed_config.Unpack(typed):
            config = json_format.MessageToDict(typed.value)
            config["filter"] = (
                json_format.MessageToDict(log.filter) if log.HasField("filter") else None
            )
            found.append(config)
    return found


def _assignment(
    resources: dict[str, list[Any]], cluster: str
) -> endpoint_pb2.ClusterLoadAssignment:
    (found,) = [a for a in resources[ENDPOINT] if a.cluster_name == cluster]
    assert isinstance(found, endpoint_pb2.ClusterLoadAssignment)
    return found


def test_the_latency_log_is_there_only_with_a_latency_route() -> None:
    static = document()
    static["routes"][0]["routing"] = "static"
    names = [log["common_config"]["log_name"] for log in _logs(translate(gateway(static)))]
    assert names == [wire.RECORD_LOG_NAME]
    logs = _logs(translate(gateway()))
    names = [log["common_config"]["log_name"] for log in logs]
    assert names == [wire.RECORD_LOG_NAME, wire.LATENCY_LOG_NAME]
    latency = logs[1]
    assert latency["common_config"]["grpc_service"] == {
        "envoy_grpc": {"cluster_name": wire.XDS_CLUSTER}
    }
    assert "routing" in latency["filter"]["extensionFilter"]["typedConfig"]["expression"]
    # Its fields' format strings are the record log's, written once; minimal: no metadata.
    fields = wire.record_fields(latency["body"]["string_value"])
    assert list(fields) == list(wire.LATENCY_LAYOUT)
    assert fields == {key: RECORD_FORMATS[key] for key in wire.LATENCY_LAYOUT}
    assert set(wire.RECORD_METADATA_FIELDS) & set(fields) == set(wire.RECORD_USAGE_FIELDS)
    assert fields[wire.RECORD_PROVIDER_TTFT_US] == "%COMMON_DURATION(US_TX_BEG:US_RX_BODY_BEG:us)%"


def test_latency_endpoints_are_tagged_and_carry_the_learned_weights() -> None:
    learned = gateway().with_weights({"chat": {"fast": 9000, "slow": 1000}})
    chat = _assignment(translate(learned), "route-chat")
    weights = {e.locality.zone: e.load_balancing_weight.value for e in chat.endpoints}
    assert weights == {"fast": 9000, "slow": 1000, "spare": 1}
    for locality in chat.endpoints:
        (host,) = locality.lb_endpoints
        assert host.load_balancing_weight.value == locality.load_balancing_weight.value
        tags = host.metadata.filter_metadata[wire.METADATA_NAMESPACE]
        assert tags[wire.META_ROUTING] == wire.ROUTING_LATENCY
    # Learned weights never touch a static route, nor the priorities.
    assert gateway().with_weights({"plain": {"fast": 7}}).routes[1].backends[0].weight == 3
    assert [e.priority for e in chat.endpoints] == [0, 0, 1]
    plain = _assignment(translate(learned), "route-plain")
    assert (
        wire.META_ROUTING
        not in plain.endpoints[0].lb_endpoints[0].metadata.filter_metadata[wire.METADATA_NAMESPACE]
    )


def test_a_route_turned_latency_on_reload_is_tagged_despite_the_memo() -> None:
    """The translator's memo keys a route's endpoints by its weights, not its routing."""
    memo = RouteMemo()
    static = document()
    static["routes"][0]["routing"] = "static"
    translate(gateway(static), memo)
    chat = _assignment(translate(gateway(), memo), "route-chat")
    tags = chat.endpoints[0].lb_endpoints[0].metadata.filter_metadata[wire.METADATA_NAMESPACE]
    assert tags[wire.META_ROUTING] == wire.ROUTING_LATENCY
