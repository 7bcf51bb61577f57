"""Hand-written static Envoy bootstraps for benchmark gateways: one listener whose
HTTP connection manager runs the given filters then the router, static clusters, the
listener and admin on ports Envoy picks (read back with EnvoyProcess.listeners())."""

from __future__ import annotations

from typing import Any

from sluicegate.xds.resource import HTTP_PROTOCOL_OPTIONS

HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def socket_address(port: int = 0) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def typed(kind: str, **fields: Any) -> dict[str, Any]:
    """A typed config: `kind` is the message's full name."""
    return {"@type": f"type.googleapis.com/{kind}", **fields}


def bootstrap(
    routes: list[dict[str, Any]], filters: list[dict[str, Any]], clusters: list[dict[str, Any]]
) -> dict[str, Any]:
    """Listener `gateway`: one virtual host with `routes`, `filters` before the router."""
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": typed("envoy.extensions.filters.http.router.v3.Router"),
    }
    hcm = typed(
        HCM,
        stat_prefix="gateway",
        route_config={"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
        http_filters=[*filters, router],
    )
    chain = {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                          "typed_config": hcm}]}  # fmt: skip
    listener = {"name": "gateway", "address": socket_address(), "filter_chains": [chain]}
    return {
        "admin": {"address": socket_address()},
        "static_resources": {"listeners": [listener], "clusters": clusters},
    }


def cluster(name: str, port: int, *, http2: bool = False) -> dict[str, Any]:
    """A STATIC cluster of one endpoint on 127.0.0.1 (HTTP/2 for a gRPC server)."""
    result: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket_address(port)}}]}],
        },
    }
    if http2:
        options = typed(HTTP_PROTOCOL_OPTIONS, explicit_http_config={"http2_protocol_options": {}})
        result["typed_extension_protocol_options"] = {HTTP_PROTOCOL_OPTIONS: options}
    return result


def plain_gateway(provider_port: int) -> dict[str, Any]:
    """Envoy alone, no ext_proc: /v1/ routed to the provider (the baseline gateway)."""
    route = {"match": {"prefix": "/v1/"}, "route": {"cluster": "provider", "timeout": "60s"}}
    return bootstrap([route], [], [cluster("provider", provider_port)])
