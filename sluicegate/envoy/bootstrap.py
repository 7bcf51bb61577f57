"""The bootstrap of an Envoy driven by sluicegate: identity, admin, the static
clusters (ADS and the two ext_proc ones), dynamic LDS/CDS over ADS, runtime and overload
manager.

Everything else (listeners, routes, provider clusters, endpoints) arrives over ADS.
Only what cannot be pushed lives here: admin, the xDS cluster itself, the ext_proc
clusters the pushed filters call (with the health checking that keeps a dead ext_proc
server out of them: `_watch_ext_proc`), and the overload manager.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final, Literal

import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import (
    address_pb2,
    backoff_pb2,
    base_pb2,
    config_source_pb2,
    grpc_service_pb2,
    health_check_pb2,
    protocol_pb2,
)
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.overload.v3 import overload_pb2
from envoy.extensions.resource_monitors.downstream_connections.v3 import (
    downstream_connections_pb2,
)
from envoy.extensions.resource_monitors.fixed_heap.v3 import fixed_heap_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import any_pb2, duration_pb2, json_format, struct_pb2, wrappers_pb2

from sluicegate import wire
from sluicegate.config import ADMIN_SOCKET_MODE, is_ip_address, parse_admin_address, split_host_port
from sluicegate.xds.resource import HTTP_PROTOCOL_OPTIONS

from .address import socket_address

AdsMode = Literal["sotw", "delta"]

DEFAULT_MAX_DOWNSTREAM_CONNECTIONS: Final = 50_000
# The ext_proc cluster carries one gRPC stream per in-flight request (and per attempt),
# held open for the request's whole life: Envoy's default of 1024 requests per cluster
# would fail requests under load, so the limits are far above any real concurrency.
_BIG_LIMIT: Final = 1_000_000
EXT_PROC_GRACEFUL_CLOSE: Final = "envoy.reloadable_features.ext_proc_graceful_grpc_close"
# The ADS stream's reconnect backoff (_ads_reconnect).
ADS_RECONNECT_BASE_S: Final = 0.25
ADS_RECONNECT_MAX_S: Final = 2.0
_CONNECT_TIMEOUT_S: Final = 2
_KEEPALIVE_INTERVAL_S: Final = 30
_KEEPALIVE_TIMEOUT_S: Final = 5
# How fast a dead ext_proc server leaves the ext_proc clusters (see _watch_ext_proc): a TCP
# connect every 0.5 s, one failure marks it unhealthy, one success brings it back.
EXT_PROC_HEALTH_INTERVAL_S: Final = 0.5
_EXT_PROC_HEALTH_TIMEOUT_S: Final = 0.25
# Streams that failed to connect or were reset, in a row, before a server is ejected at
# once (between two health checks); the next passing health check un-ejects it.
EXT_PROC_EJECT_AFTER_FAILURES: Final = 2
_EXT_PROC_EJECTION_S: Final = 10


def _seconds(value: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(int(value * 1_000_000_000))
    return duration


def _pack(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _grpc_cluster(name: str, *addresses: str) -> cluster_pb2.Cluster:
    """A static HTTP/2 cluster for gRPC servers at `addresses` (IPs: STATIC, else DNS).

    Several addresses (ext_proc replicas) are endpoints of one cluster: Envoy balances
    each new gRPC stream, i.e. each request, across them (round robin), so each replica's
    share of a concurrency gate sees about the same number of requests."""
    hosts = [split_host_port(address) for address in addresses]
    by_ip = all(is_ip_address(host) for host, _ in hosts)
    keepalive = protocol_pb2.KeepaliveSettings(
        interval=_seconds(_KEEPALIVE_INTERVAL_S), timeout=_seconds(_KEEPALIVE_TIMEOUT_S)
    )
    options = http_protocol_options_pb2.HttpProtocolOptions(
        explicit_http_config=http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig(
            http2_protocol_options=protocol_pb2.Http2ProtocolOptions(connection_keepalive=keepalive)
        )
    )
    limit = wrappers_pb2.UInt32Value(value=_BIG_LIMIT)
    thresholds = circuit_breaker_pb2.CircuitBreakers.Thresholds(
        max_connections=limit, max_pending_requests=limit, max_requests=limit
    )
    cluster = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.STATIC if by_ip else cluster_pb2.Cluster.STRICT_DNS,
        connect_timeout=_seconds(_CONNECT_TIMEOUT_S),
        circuit_breakers=circuit_breaker_pb2.CircuitBreakers(thresholds=[thresholds]),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                endpoint_components_pb2.LocalityLbEndpoints(
                    lb_endpoints=[
                        endpoint_components_pb2.LbEndpoint(
                            endpoint=endpoint_components_pb2.Endpoint(
                                address=socket_address(host, port)
                            )
                        )
                        for host, port in hosts
                    ]
                )
            ],
        ),
    )
    if not by_ip:
        cluster.dns_lookup_family = cluster_pb2.Cluster.V4_PREFERRED
    cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].Pack(options)
    return cluster


def _watch_ext_proc(cluster: cluster_pb2.Cluster) -> cluster_pb2.Cluster:
    """Keep a dead ext_proc server out of `cluster` within about a second, and bring it
    back as soon as it listens again.

    - An active TCP health check (connect only, a new connection each time, so a server
      never closes an idle probe on us) every 0.5 s: a killed server refuses the next
      probe and is unhealthy until a probe connects again. TCP, not gRPC health, so the
      servers need no grpc.health.v1 service (no extra dependency); a server that is
      alive but wedged is left to ext_proc's message_timeout.
    - Outlier detection on local-origin failures only (connect failures, resets): a few
      failed streams in a row eject the server at once, before the next probe.
      Everything the ext_proc server answers itself (a gRPC status) is left alone, so
      a client's bad request never ejects a server. A passing probe un-ejects it.
    - No panic mode: with every server down Envoy sends to none (the ext_proc filter
      then fails with gRPC UNAVAILABLE, which the listener answers as a 503) instead of
      spreading requests over dead servers.
    """
    health = health_check_pb2.HealthCheck(
        timeout=_seconds(_EXT_PROC_HEALTH_TIMEOUT_S),
        interval=_seconds(EXT_PROC_HEALTH_INTERVAL_S),
        # Without traffic Envoy would probe every 60 s: a server that died while idle
        # would still take the first requests.
        no_traffic_interval=_seconds(EXT_PROC_HEALTH_INTERVAL_S),
        unhealthy_threshold=wrappers_pb2.UInt32Value(value=1),
        healthy_threshold=wrappers_pb2.UInt32Value(value=1),
        reuse_connection=wrappers_pb2.BoolValue(value=False),
        tcp_health_check=health_check_pb2.HealthCheck.TcpHealthCheck(),
    )
    cluster.health_checks.append(health)

    def u32(value: int) -> wrappers_pb2.UInt32Value:
        return wrappers_pb2.UInt32Value(value=value)

    cluster.outlier_detection.CopyFrom(
        outlier_detection_pb2.OutlierDetection(
            split_external_local_origin_errors=True,
            consecutive_local_origin_failure=u32(EXT_PROC_EJECT_AFTER_FAILURES),
            enforcing_consecutive_local_origin_failure=u32(100),
            enforcing_consecutive_5xx=u32(0),
            enforcing_consecutive_gateway_failure=u32(0),
            enforcing_success_rate=u32(0),
            enforcing_local_origin_success_rate=u32(0),
            enforcing_failure_percentage=u32(0),
            enforcing_failure_percentage_local_origin=u32(0),
            interval=_seconds(1),
            base_ejection_time=_seconds(_EXT_PROC_EJECTION_S),
            max_ejection_percent=u32(100),
            successful_active_health_check_uneject_host=wrappers_pb2.BoolValue(value=True),
        )
    )
    cluster.common_lb_config.healthy_panic_threshold.CopyFrom(percent_pb2.Percent(value=0))
    return cluster


def _ads_reconnect() -> base_pb2.RetryPolicy:
    """How soon Envoy opens the ADS stream again after the control plane went away:
    0.25 s, doubling (jittered) to at most 2 s, instead of Envoy's 0.5 s to 30 s. It
    serves its last config meanwhile, so a restarted control plane is back in charge
    within about 2 s of listening again, however long it was gone."""
    return base_pb2.RetryPolicy(
        retry_back_off=backoff_pb2.BackoffStrategy(
            base_interval=_seconds(ADS_RECONNECT_BASE_S), max_interval=_seconds(ADS_RECONNECT_MAX_S)
        )
    )


def _dynamic_resources(
    ads_mode: str, initial_fetch_timeout_s: float | None
) -> bootstrap_pb2.Bootstrap.DynamicResources:
    api_type = {
        "sotw": config_source_pb2.ApiConfigSource.GRPC,
        "delta": config_source_pb2.ApiConfigSource.DELTA_GRPC,
    }.get(ads_mode)
    if api_type is None:
        raise ValueError(f"ads_mode must be 'sotw' or 'delta', got {ads_mode!r}")
    ads = config_source_pb2.ApiConfigSource(
        api_type=api_type,
        transport_api_version=config_source_pb2.V3,
        grpc_services=[
            grpc_service_pb2.GrpcService(
                envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(
                    cluster_name=wire.XDS_CLUSTER, retry_policy=_ads_reconnect()
                )
            )
        ],
        set_node_on_first_message_only=True,
    )

    def over_ads() -> config_source_pb2.ConfigSource:
        source = config_source_pb2.ConfigSource(
            ads=config_source_pb2.AggregatedConfigSource(),
            resource_api_version=config_source_pb2.V3,
        )
        if initial_fetch_timeout_s is not None:
            source.initial_fetch_timeout.CopyFrom(_seconds(initial_fetch_timeout_s))
        return source

    return bootstrap_pb2.Bootstrap.DynamicResources(
        ads_config=ads, lds_config=over_ads(), cds_config=over_ads()
    )


def _static_runtime() -> struct_pb2.Struct:
    """Envoy's defaults, but one: ext_proc streams end gracefully. Envoy otherwise ends each
    ext_proc stream by half-closing and resetting it at once, and grpcio's aio server keeps
    about 100 bytes of native memory for every stream cut that way (grpc/grpc#43360): the
    ext_proc servers grew by about 200 bytes a request, without bound (RESULTS.md, "Memory
    soak"). Graceful: Envoy half-closes, the server ends the call with its status, and
    Envoy resets only a stream still open a second later (ext_proc's remote close timeout)."""
    layer = struct_pb2.Struct()
    layer.update({EXT_PROC_GRACEFUL_CLOSE: True})
    return layer


def _layered_runtime() -> bootstrap_pb2.LayeredRuntime:
    """A static layer (defaults but one: _static_runtime) under an admin layer (for
    /runtime_modify)."""
    return bootstrap_pb2.LayeredRuntime(
        layers=[
            bootstrap_pb2.RuntimeLayer(name="static", static_layer=_static_runtime()),
            bootstrap_pb2.RuntimeLayer(
                name="admin", admin_layer=bootstrap_pb2.RuntimeLayer.AdminLayer()
            ),
        ]
    )


def _overload_manager(
    max_downstream_connections: int, max_heap_bytes: int | None
) -> overload_pb2.OverloadManager:
    """Caps downstream connections over all listeners (each listener also has its own
    cap, `limits.max_connections_per_listener`); with a heap budget, sheds load before
    running out."""
    manager = overload_pb2.OverloadManager(
        refresh_interval=_seconds(0.25),
        resource_monitors=[
            overload_pb2.ResourceMonitor(
                name="envoy.resource_monitors.global_downstream_max_connections",
                typed_config=_pack(
                    downstream_connections_pb2.DownstreamConnectionsConfig(
                        max_active_downstream_connections=max_downstream_connections
                    )
                ),
            )
        ],
    )
    if max_heap_bytes is not None:
        heap = "envoy.resource_monitors.fixed_heap"
        manager.resource_monitors.append(
            overload_pb2.ResourceMonitor(
                name=heap,
                typed_config=_pack(
                    fixed_heap_pb2.FixedHeapConfig(max_heap_size_bytes=max_heap_bytes)
                ),
            )
        )

        def action(name: str, threshold: float) -> overload_pb2.OverloadAction:
            trigger = overload_pb2.Trigger(
                name=heap, threshold=overload_pb2.ThresholdTrigger(value=threshold)
            )
            return overload_pb2.OverloadAction(name=name, triggers=[trigger])

        # Near the budget: give memory back and close connections after their request;
        # at it: answer new requests with a 503 (the listener's `gateway_overloaded`
        # error) and close new connections at once, so streams in flight can finish.
        manager.actions.extend(
            [
                action("envoy.overload_actions.shrink_heap", 0.95),
                action("envoy.overload_actions.disable_http_keepalive", 0.95),
                action("envoy.overload_actions.stop_accepting_requests", 0.98),
                action("envoy.overload_actions.reject_incoming_connections", 0.98),
            ]
        )
    return manager


def _admin(address: str) -> bootstrap_pb2.Admin:
    """Envoy's admin on TCP or on a Unix socket (a pipe) of mode 0600: whoever can
    connect may set the log level to debug, and Envoy's debug log prints keys."""
    admin = parse_admin_address(address, allow_port_zero=True)
    if admin.path is not None:
        pipe = address_pb2.Pipe(path=admin.path, mode=ADMIN_SOCKET_MODE)
        return bootstrap_pb2.Admin(address=address_pb2.Address(pipe=pipe))
    return bootstrap_pb2.Admin(address=socket_address(admin.host, admin.port))


# The longest library path a node may name (Linux's PATH_MAX).
MAX_PATH_CHARS: Final = 4096


def _library_path(path: str) -> bool:
    """An absolute path of printable characters, at most MAX_PATH_CHARS long."""
    return path.startswith("/") and len(path) <= MAX_PATH_CHARS and path.isprintable()


def _node(node_id: str, cluster: str, native_module: str | None) -> base_pb2.Node:
    node = base_pb2.Node(id=node_id, cluster=cluster)
    if native_module is not None:
        if not _library_path(native_module):
            raise ValueError(
                "the native filters library must be an absolute path of printable "
                f"characters, at most {MAX_PATH_CHARS} long: {native_module!r}"
            )
        node.metadata.update({wire.METADATA_NAMESPACE: {wire.NODE_NATIVE_MODULE: native_module}})
    return node


def declared_native_module(node: base_pb2.Node) -> str | None:
    """The native filters library a node's bootstrap names (`_node`), or None (also for
    a value that is not an absolute, printable path of at most MAX_PATH_CHARS: node
    metadata is what any xDS client says of itself)."""
    fields = node.metadata.fields
    if wire.METADATA_NAMESPACE not in fields:
        return None
    ours = fields[wire.METADATA_NAMESPACE].struct_value.fields
    if wire.NODE_NATIVE_MODULE not in ours:
        return None
    path = ours[wire.NODE_NATIVE_MODULE].string_value
    return path if _library_path(path) else None


def _addresses(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def make_bootstrap(
    node_id: str,
    cluster: str,
    xds_address: str,
    ext_proc_address: str | Sequence[str],
    admin_address: str,
    ads_mode: AdsMode | str = "sotw",
    *,
    max_downstream_connections: int = DEFAULT_MAX_DOWNSTREAM_CONNECTIONS,
    max_heap_bytes: int | None = None,
    initial_fetch_timeout_s: float | None = None,
    native_module: str | None = None,
) -> bootstrap_pb2.Bootstrap:
    """The bootstrap for an Envoy that takes its listeners and clusters from sluicegate.

    `ext_proc_address` may name several ext_proc servers (replicas sharing a Redis store).
    `admin_address` may use port 0 (Envoy picks one; EnvoyProcess reads it back), or be
    `unix:/path`: a socket that only Envoy's user may open (`_admin`).
    `initial_fetch_timeout_s` bounds how long Envoy waits for LDS/CDS before it
    declares itself ready anyway (Envoy's default is 15 s).
    `native_module` is the path of sluicegate's native filters library on Envoy's machine,
    told to the control plane in the node's metadata (docs/native-filters.md).
    """
    if not node_id:
        raise ValueError("node_id must not be empty")
    return bootstrap_pb2.Bootstrap(
        node=_node(node_id, cluster, native_module),
        admin=_admin(admin_address),
        static_resources=bootstrap_pb2.Bootstrap.StaticResources(
            clusters=[
                _grpc_cluster(wire.XDS_CLUSTER, xds_address),
                _watch_ext_proc(
                    _grpc_cluster(wire.EXT_PROC_CLUSTER, *_addresses(ext_proc_address))
                ),
                _watch_ext_proc(
                    _grpc_cluster(wire.EXT_PROC_SIDE_CLUSTER, *_addresses(ext_proc_address))
                ),
            ]
        ),
        dynamic_resources=_dynamic_resources(ads_mode, initial_fetch_timeout_s),
        layered_runtime=_layered_runtime(),
        overload_manager=_overload_manager(max_downstream_connections, max_heap_bytes),
    )


def bootstrap_dict(bootstrap: bootstrap_pb2.Bootstrap) -> dict[str, Any]:
    """The bootstrap as Envoy's JSON/YAML form (proto field names, typed `@type`s)."""
    # Through JSON text: MessageToDict leaves OrderedDicts (for Any) that YAML cannot dump.
    text = json_format.MessageToJson(bootstrap, preserving_proto_field_name=True)
    result: dict[str, Any] = json.loads(text)
    return result


def bootstrap_json(
    node_id: str,
    cluster: str = "sluicegate",
    xds_address: str = "127.0.0.1:18000",
    ext_proc_address: str | Sequence[str] = "127.0.0.1:18001",
    admin_address: str = "127.0.0.1:9901",
    ads_mode: AdsMode | str = "sotw",
    **options: Any,
) -> str:
    """`make_bootstrap` as JSON, for an Envoy started elsewhere (a sidecar).

    JSON because Envoy picks the parser by file name: a path without a .yaml/.yml ending,
    such as the /dev/fd/63 of `envoy -c <(sluicegate bootstrap ...)`, is read as JSON only.
    JSON is also YAML, so the same text works saved as bootstrap.yaml.
    """
    bootstrap = make_bootstrap(
        node_id, cluster, xds_address, ext_proc_address, admin_address, ads_mode, **options
    )
    return json.dumps(bootstrap_dict(bootstrap), indent=2)


def bootstrap_yaml(
    node_id: str,
    cluster: str = "sluicegate",
    xds_address: str = "127.0.0.1:18000",
    ext_proc_address: str | Sequence[str] = "127.0.0.1:18001",
    admin_address: str = "127.0.0.1:9901",
    ads_mode: AdsMode | str = "sotw",
    **options: Any,
) -> str:
    """`make_bootstrap` as commented YAML, to read or keep in a file named *.yaml (Envoy
    reads YAML only from such a name; `bootstrap_json` works under any name)."""
    bootstrap = make_bootstrap(
        node_id, cluster, xds_address, ext_proc_address, admin_address, ads_mode, **options
    )
    header = (
        f"# Envoy bootstrap generated by sluicegate for node {node_id!r}.\n"
        f"# Listeners and clusters come over ADS from {xds_address}; "
        f"ext_proc at {', '.join(_addresses(ext_proc_address))}.\n"
    )
    return header + yaml.safe_dump(bootstrap_dict(bootstrap), sort_keys=False)
