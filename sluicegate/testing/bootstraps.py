"""Envoy bootstraps that serve translated resources without an xDS server.

`static_bootstrap` inlines what xDS would deliver (RDS → route_config, EDS → a STATIC
cluster with the same ClusterLoadAssignment), so `envoy --mode validate` checks every
generated message, and a running Envoy serves exactly what the control plane would push.
`ads_bootstrap` keeps listeners and clusters as generated (rds / eds_config over ADS) to
check those config sources too. Provider keys (SDS over ADS when pushed) become static
secrets in `static_bootstrap`, referenced by name; `ads_bootstrap` keeps them on ADS.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import extension_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from sluicegate import wire
from sluicegate.xds.resource import HTTP_PROTOCOL_OPTIONS, TYPE_PREFIX
from sluicegate.xds.translate import CLUSTER, ENDPOINT, EXTENSION_CONFIG, LISTENER, ROUTE, SECRET


def to_dict(message: Message) -> dict[str, Any]:
    """Plain dicts (MessageToDict may return OrderedDicts for Any), proto field names."""
    plain: dict[str, Any] = json.loads(
        json.dumps(MessageToDict(message, preserving_proto_field_name=True))
    )
    return plain


def grpc_cluster(name: str, port: int) -> dict[str, Any]:
    """A static HTTP/2 cluster (what the real bootstrap declares for xDS and ext_proc)."""
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            HTTP_PROTOCOL_OPTIONS: {
                "@type": TYPE_PREFIX + HTTP_PROTOCOL_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {"address": "127.0.0.1", "port_value": port}
                                }
                            }
                        }
                    ]
                }
            ],
        },
    }


def edited_listeners(
    resources: Mapping[str, Sequence[Message]],
    edit: Callable[[hcm_pb2.HttpConnectionManager], None],
) -> list[listener_pb2.Listener]:
    """Copies of the translation's listeners, `edit` applied to each one's HTTP connection
    manager (the network filter after an optional connection limit)."""
    listeners = []
    for resource in resources[LISTENER]:
        assert isinstance(resource, listener_pb2.Listener)
        listener = listener_pb2.Listener()
        listener.CopyFrom(resource)
        for chain in listener.filter_chains:
            for network_filter in chain.filters:
                if not network_filter.typed_config.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
                    continue  # the connection limit before it
                hcm = hcm_pb2.HttpConnectionManager()
                assert network_filter.typed_config.Unpack(hcm)
                edit(hcm)
                network_filter.typed_config.Pack(hcm)
        listeners.append(listener)
    return listeners


def static_bootstrap(
    resources: Mapping[str, Sequence[Message]], *, ext_proc_port: int, admin_port: int = 0
) -> dict[str, Any]:
    """Listeners with inline route configs and filter configs (ECDS), EDS clusters turned
    STATIC with their CLA, SDS secrets turned static (a static secret is named without
    `sds_config`)."""
    routes = {r.name: r for r in resources[ROUTE] if isinstance(r, route_pb2.RouteConfiguration)}
    extensions = {
        e.name: e
        for e in resources.get(EXTENSION_CONFIG, ())
        if isinstance(e, extension_pb2.TypedExtensionConfig)
    }
    assignments = {
        a.cluster_name: a
        for a in resources[ENDPOINT]
        if isinstance(a, endpoint_pb2.ClusterLoadAssignment)
    }

    def inline_routes(hcm: hcm_pb2.HttpConnectionManager) -> None:
        hcm.route_config.CopyFrom(routes[hcm.rds.route_config_name])
        for http_filter in hcm.http_filters:
            if http_filter.HasField("config_discovery"):
                http_filter.typed_config.CopyFrom(extensions[http_filter.name].typed_config)

    listeners = [to_dict(listener) for listener in edited_listeners(resources, inline_routes)]
    clusters = []
    for resource in resources[CLUSTER]:
        assert isinstance(resource, cluster_pb2.Cluster)
        cluster = cluster_pb2.Cluster()
        cluster.CopyFrom(resource)
        if cluster.type == cluster_pb2.Cluster.EDS:
            cluster.ClearField("eds_cluster_config")
            cluster.type = cluster_pb2.Cluster.STATIC
            cluster.load_assignment.CopyFrom(assignments[cluster.name])
        clusters.append(to_dict(cluster))
    clusters.append(grpc_cluster(wire.EXT_PROC_CLUSTER, ext_proc_port))
    clusters.append(grpc_cluster(wire.EXT_PROC_SIDE_CLUSTER, ext_proc_port))
    return {
        "admin": admin(admin_port),
        "static_resources": {
            "listeners": without_sds_config(listeners),
            "clusters": without_sds_config(clusters),
            "secrets": [to_dict(item) for item in resources.get(SECRET, ())],
        },
    }


def without_sds_config(value: Any) -> Any:
    """A copy with every SdsSecretConfig's `sds_config` dropped: it then names a static secret."""
    if isinstance(value, dict):
        return {key: without_sds_config(item) for key, item in value.items() if key != "sds_config"}
    if isinstance(value, list):
        return [without_sds_config(item) for item in value]
    return value


def ads_bootstrap(resources: Mapping[str, Sequence[Message]]) -> dict[str, Any]:
    """Listeners and clusters exactly as generated, with an ADS source they can name."""
    return {
        "admin": admin(0),
        "node": {"id": "validate", "cluster": "sluicegate"},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": wire.XDS_CLUSTER}}],
            }
        },
        "static_resources": {
            "listeners": [to_dict(item) for item in resources[LISTENER]],
            "clusters": [to_dict(item) for item in resources[CLUSTER]]
            + [
                grpc_cluster(name, 1)
                for name in (wire.XDS_CLUSTER, wire.EXT_PROC_CLUSTER, wire.EXT_PROC_SIDE_CLUSTER)
            ],
        },
    }


def admin(port: int) -> dict[str, Any]:
    """Envoy's admin interface on 127.0.0.1 (port 0: Envoy picks)."""
    return {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}
