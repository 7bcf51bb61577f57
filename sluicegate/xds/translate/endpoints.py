"""Endpoints: a route's providers as the hosts of its cluster.

Each provider is one LbEndpoint in a locality of its own (`zone` = provider name), grouped
by backend priority (fallback order). The provider's weight is set on the locality, and
the cluster enables locality-weighted balancing: with a DNS cluster a host name resolving
to N addresses becomes N hosts, and host weights alone would give that provider N times
its share. The LbEndpoint carries the same weight, which is exact for single-address
providers and keeps the intent visible in config_dump.

Endpoint metadata, namespace wire.METADATA_NAMESPACE, is what the per-attempt upstream
filters read once Envoy has picked a host: `provider`, `path_prefix`, and `model_map` (only
this route's renamed models); on a `routing: latency` route also `routing: latency`, which
the latency record log's filter matches (record_log.py). Never a key: keys travel as SDS
secrets (secrets.py), which Envoy redacts in config_dump, while endpoint metadata shows
there in full.
Namespace `envoy.transport_socket_match` selects the provider's TLS settings.

The same ClusterLoadAssignment is either pushed over EDS (IP-literal hosts) or inlined
into a DNS cluster (clusters.py). A `routing: latency` route is always EDS (validation):
the control plane's learned weights (Gateway.with_weights) are the backends' weights here,
so a weight change changes this route's ClusterLoadAssignment and nothing else.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2 as ec
from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import wrappers_pb2

from sluicegate import wire
from sluicegate.model import Backend, Gateway, Route

from ._proto import struct
from .health_checks import endpoint_health_check_config
from .memo import RouteMemo

TRANSPORT_SOCKET_MATCH = "envoy.transport_socket_match"
TRANSPORT_MATCH_KEY = "provider"


def build_endpoints(
    gateway: Gateway, memo: RouteMemo | None = None
) -> list[endpoint_pb2.ClusterLoadAssignment]:
    """ClusterLoadAssignments for the EDS clusters, sorted by cluster name."""
    # The memo's route key holds the weights but not `routing`, which the metadata shows.
    assignments = [
        load_assignment(route)
        if memo is None
        else memo.get(
            ("endpoints", route.routing), route, gateway.limits, partial(load_assignment, route)
        )
        for route in gateway.routes
        if route.uses_eds
    ]
    return sorted(assignments, key=lambda item: item.cluster_name)


def load_assignment(route: Route) -> endpoint_pb2.ClusterLoadAssignment:
    """The route's providers as localities, sorted by (priority, provider name)."""
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=route.cluster_name,
        endpoints=[
            ec.LocalityLbEndpoints(
                locality=base_pb2.Locality(zone=backend.provider.name),
                priority=backend.priority,
                load_balancing_weight=wrappers_pb2.UInt32Value(value=backend.weight),
                lb_endpoints=[_lb_endpoint(route, backend)],
            )
            for backend in route.backends
        ],
    )


def endpoint_metadata(route: Route, backend: Backend) -> dict[str, Any]:
    """The facts a per-attempt filter needs about the chosen provider."""
    provider = backend.provider
    values: dict[str, Any] = {
        wire.META_PROVIDER: provider.name,
        wire.META_PATH_PREFIX: provider.path_prefix,
    }
    model_map = route.model_map_for(provider)
    if model_map:
        values[wire.META_MODEL_MAP] = model_map
    if route.learns_weights:
        values[wire.META_ROUTING] = wire.ROUTING_LATENCY
    return values


def _lb_endpoint(route: Route, backend: Backend) -> ec.LbEndpoint:
    provider = backend.provider
    filter_metadata = {wire.METADATA_NAMESPACE: struct(endpoint_metadata(route, backend))}
    if provider.tls is not None:
        filter_metadata[TRANSPORT_SOCKET_MATCH] = struct({TRANSPORT_MATCH_KEY: provider.name})
    lb_endpoint = ec.LbEndpoint(
        endpoint=ec.Endpoint(
            address=address_pb2.Address(
                socket_address=address_pb2.SocketAddress(
                    address=provider.host, port_value=provider.port
                )
            ),
            # auto_host_rewrite sends this as Host on each attempt.
            hostname=provider.authority,
        ),
        load_balancing_weight=wrappers_pb2.UInt32Value(value=backend.weight),
        metadata=base_pb2.Metadata(filter_metadata=filter_metadata),
    )
    # Active health checks (health_checks.py): the provider's Host, or none for it.
    check = endpoint_health_check_config(route, provider)
    if check is not None:
        lb_endpoint.endpoint.health_check_config.CopyFrom(check)
    return lb_endpoint
