"""Helpers for the ADS server tests: raw gRPC streams with bounded reads, an
in-process server wrapper, and small Envoy resources."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, symbol_database
from google.rpc import status_pb2

from sluicegate.xds.resource import CLUSTER, ENDPOINT, LISTENER, ROUTE
from sluicegate.xds.server import Snapshot, SnapshotCache, bound_port
from sluicegate.xds.server.stream import GRPC_EOF

#: Bound on any single wait in these tests.
WAIT = 5.0
#: How long "nothing arrives" is watched for.
QUIET = 0.3


# ----- resources ---------------------------------------------------------------------------


def ads_source() -> Any:
    from envoy.config.core.v3 import config_source_pb2

    source = config_source_pb2.ConfigSource(resource_api_version=config_source_pb2.V3)
    source.ads.SetInParent()
    return source


def cluster(name: str, timeout_s: int = 1) -> Any:
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS)
    c.connect_timeout.seconds = timeout_s
    c.eds_cluster_config.eds_config.CopyFrom(ads_source())
    return c


def cla(name: str, port: int = 9000) -> Any:
    endpoint = endpoint_components_pb2.LbEndpoint()
    address = endpoint.endpoint.address.socket_address
    address.address = "127.0.0.1"
    address.port_value = port
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=name,
        endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[endpoint])],
    )


def route(name: str, body: str = "v1", target: str | None = None) -> Any:
    r = route_components_pb2.Route()
    r.match.prefix = "/"
    if target is None:
        r.direct_response.status = 200
        r.direct_response.body.inline_string = body
    else:
        r.route.cluster = target
    vhost = route_components_pb2.VirtualHost(name="all", domains=["*"], routes=[r])
    return route_pb2.RouteConfiguration(name=name, virtual_hosts=[vhost])


def listener(name: str, route_name: str, port: int = 10000) -> Any:
    from envoy.extensions.filters.http.router.v3 import router_pb2

    manager = hcm_pb2.HttpConnectionManager(stat_prefix=name)
    manager.rds.route_config_name = route_name
    manager.rds.config_source.CopyFrom(ads_source())
    router = manager.http_filters.add(name="envoy.filters.http.router")
    router.typed_config.Pack(router_pb2.Router())
    lis = listener_pb2.Listener(name=name)
    lis.address.socket_address.address = "127.0.0.1"
    lis.address.socket_address.port_value = port
    chain = lis.filter_chains.add()
    net_filter = chain.filters.add(name="envoy.filters.network.http_connection_manager")
    net_filter.typed_config.Pack(manager, deterministic=True)
    return lis


#: The type a Lua filter's config has; an ECDS filter lists the types it accepts.
LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"


def lua_config(name: str, header_value: str) -> Any:
    """An ECDS resource: a Lua filter `name` that adds `x-ecds: header_value` to responses."""
    from envoy.config.core.v3 import extension_pb2
    from envoy.extensions.filters.http.lua.v3 import lua_pb2

    code = f"function envoy_on_response(h) h:headers():add('x-ecds', '{header_value}') end"
    config = extension_pb2.TypedExtensionConfig(name=name)
    config.typed_config.Pack(lua_pb2.Lua(default_source_code={"inline_string": code}))
    return config


def ecds_listener(name: str, route_name: str, filters: Iterable[str], port: int = 10000,
                  source: Any = None) -> Any:  # fmt: skip
    """`listener`, with HTTP filters (before the router) whose configs come from ECDS,
    each named by the filter (`source`: where from; ADS by default)."""
    lis = listener(name, route_name, port)
    manager = hcm_pb2.HttpConnectionManager()
    packed = lis.filter_chains[0].filters[0].typed_config
    packed.Unpack(manager)
    for index, filter_name in enumerate(filters):
        http_filter = hcm_pb2.HttpFilter(name=filter_name)
        http_filter.config_discovery.config_source.CopyFrom(source or ads_source())
        http_filter.config_discovery.type_urls.append(LUA)
        manager.http_filters.insert(index, http_filter)
    packed.Pack(manager, deterministic=True)
    return lis


def snapshot(
    clusters: Iterable[str] = ("a",),
    endpoints: dict[str, int] | None = None,
    routes: dict[str, str] | None = None,
    listeners: dict[str, str] | None = None,
) -> Snapshot:
    """clusters: names; endpoints: cluster → port; routes: name → body;
    listeners: name → route name. Endpoints default to one per cluster."""
    clusters = list(clusters)
    endpoints = {c: 9000 for c in clusters} if endpoints is None else endpoints
    routes = {"r": "v1"} if routes is None else routes
    listeners = {"l": "r"} if listeners is None else listeners
    return Snapshot.from_resources({
        CLUSTER: [cluster(c) for c in clusters],
        ENDPOINT: [cla(c, p) for c, p in endpoints.items()],
        ROUTE: [route(n, b) for n, b in routes.items()],
        LISTENER: [listener(n, r) for n, r in listeners.items()],
    })  # fmt: skip


def names_of(response: Any) -> list[str]:
    """Names in a SotW or delta response."""
    if isinstance(response, discovery_pb2.DeltaDiscoveryResponse):
        return [r.name for r in response.resources]
    return [_any_name(a) for a in response.resources]


def _any_name(packed: any_pb2.Any) -> str:
    message: Any = symbol_database.Default().GetSymbol(packed.type_url.rsplit("/", 1)[-1])()
    packed.Unpack(message)
    name: str = message.cluster_name if packed.type_url == ENDPOINT else message.name
    return name


# ----- raw streams -------------------------------------------------------------------------


class Raw:
    """A raw ADS stream with bounded reads, for asserting wire behaviour."""

    def __init__(self, call: Any, delta: bool) -> None:
        self.call = call
        self.delta = delta
        self._next: asyncio.Task[Any] | None = None

    async def send(self, **fields: Any) -> None:
        error = fields.pop("error", None)
        cls = discovery_pb2.DeltaDiscoveryRequest if self.delta else discovery_pb2.DiscoveryRequest
        request = cls(**fields)
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        await self.call.write(request)

    async def recv(self, timeout: float = WAIT) -> Any:
        """The next response; fails after `timeout`."""
        if self._next is None:
            self._next = asyncio.ensure_future(self.call.read())
        done, _ = await asyncio.wait({self._next}, timeout=timeout)
        if not done:
            raise AssertionError(f"no response within {timeout}s")
        task, self._next = self._next, None
        response = task.result()
        assert response is not GRPC_EOF, "stream ended"
        return response

    async def quiet(self, within: float = QUIET) -> None:
        """Assert that nothing arrives for `within` seconds."""
        if self._next is None:
            self._next = asyncio.ensure_future(self.call.read())
        done, _ = await asyncio.wait({self._next}, timeout=within)
        if done:
            response = self._next.result()
            raise AssertionError(f"unexpected response: {response}")

    async def ack(self, response: Any, names: Iterable[str] | None = None) -> None:
        """ACK like Envoy: SotW repeats version and names; delta only the nonce."""
        if self.delta:
            await self.send(type_url=response.type_url, response_nonce=response.nonce)
        else:
            await self.send(
                type_url=response.type_url,
                version_info=response.version_info,
                response_nonce=response.nonce,
                resource_names=list(names or ()),
            )

    def close(self) -> None:
        if self._next is not None:
            self._next.cancel()
        self.call.cancel()


class Ads:
    """An in-process ADS server and a way to open raw streams to it."""

    def __init__(self, cache: SnapshotCache, server: grpc.aio.Server) -> None:
        self.cache = cache
        self.server = server
        self.target = f"127.0.0.1:{bound_port(server)}"
        self.channel = grpc.aio.insecure_channel(self.target)
        self.stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        self.streams: list[Raw] = []

    def sotw(self) -> Raw:
        raw = Raw(self.stub.StreamAggregatedResources(), delta=False)
        self.streams.append(raw)
        return raw

    def delta(self) -> Raw:
        raw = Raw(self.stub.DeltaAggregatedResources(), delta=True)
        self.streams.append(raw)
        return raw

    def node(self, node_id: str) -> Any:
        from envoy.config.core.v3 import base_pb2

        return base_pb2.Node(id=node_id, cluster="test-cluster")
