"""A static Envoy config that wires both ext_proc stages the way sluicegate intends.

Listener -> HCM [ext_proc routing stage, router]; routes match the model header the
routing stage sets. Each route's cluster has providers as endpoints with metadata
{sluicegate: {provider, model_map, path_prefix}} and upstream filters
[header_mutation (x-sluicegate-provider), ext_proc attempt stage, upstream_codec].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sluicegate import wire
from sluicegate.filters import META_ROUTE, REQUEST_ATTRIBUTES
from sluicegate.xds.resource import HTTP_PROTOCOL_OPTIONS

EXT_PROC = "envoy.filters.http.ext_proc"
EXT_PROC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
NO_ROUTE_BODY = (
    '{"error": {"message": "no route", "type": "invalid_request_error", '
    '"param": null, "code": "no_route"}}'
)


@dataclass
class Provider:
    name: str
    port: int
    priority: int = 0
    path_prefix: str | None = None
    model_map: dict[str, str] = field(default_factory=dict)


@dataclass
class Route:
    name: str
    models: Sequence[str]
    providers: Sequence[Provider]
    path_prefix: str = "/v1/"


def _socket(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def ext_proc_filter(stage: str, attempt: bool = False) -> dict[str, Any]:
    config: dict[str, Any] = {
        "@type": EXT_PROC_TYPE,
        "grpc_service": {
            "envoy_grpc": {"cluster_name": wire.EXT_PROC_CLUSTER},
            "initial_metadata": [{"key": wire.STAGE_METADATA_KEY, "value": stage}],
        },
        # Headers SEND in both stages: see sluicegate.filters.routing / .attempt.
        "processing_mode": {
            "request_header_mode": "SEND",
            "response_header_mode": "SKIP",
            "request_body_mode": "BUFFERED",
        },
        "message_timeout": "5s",
        "failure_mode_allow": False,
    }
    if attempt:
        config["request_attributes"] = list(REQUEST_ATTRIBUTES)
        namespaces = {"untyped": [wire.METADATA_NAMESPACE]}
        config["metadata_options"] = {
            "forwarding_namespaces": namespaces,
            "receiving_namespaces": namespaces,
        }
    return {"name": EXT_PROC, "typed_config": config}


def _endpoint(provider: Provider) -> dict[str, Any]:
    meta: dict[str, Any] = {wire.META_PROVIDER: provider.name}
    if provider.path_prefix is not None:
        meta[wire.META_PATH_PREFIX] = provider.path_prefix
    if provider.model_map:
        meta[wire.META_MODEL_MAP] = provider.model_map
    return {
        "priority": provider.priority,
        "lb_endpoints": [
            {
                "endpoint": {"address": _socket(provider.port)},
                "metadata": {"filter_metadata": {wire.METADATA_NAMESPACE: meta}},
            }
        ],
    }


def _provider_cluster(route: Route) -> dict[str, Any]:
    provider_header = {
        "append": {
            "header": {
                "key": wire.PROVIDER_HEADER,
                "value": f"%UPSTREAM_METADATA({wire.METADATA_NAMESPACE}:{wire.META_PROVIDER})%",
            },
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    }
    return {
        "name": f"llm_{route.name}",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": f"llm_{route.name}",
            "endpoints": [_endpoint(p) for p in route.providers],
        },
        "typed_extension_protocol_options": {
            HTTP_PROTOCOL_OPTIONS: {
                "@type": f"type.googleapis.com/{HTTP_PROTOCOL_OPTIONS}",
                "explicit_http_config": {"http_protocol_options": {}},
                "http_filters": [
                    {
                        "name": "envoy.filters.http.header_mutation",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http."
                            "header_mutation.v3.HeaderMutation",
                            "mutations": {"request_mutations": [provider_header]},
                        },
                    },
                    ext_proc_filter(wire.STAGE_ATTEMPT, attempt=True),
                    {
                        "name": "envoy.filters.http.upstream_codec",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http."
                            "upstream_codec.v3.UpstreamCodec"
                        },
                    },
                ],
            }
        },
    }


def _route_entries(route: Route) -> list[dict[str, Any]]:
    retry = {
        "retry_on": "5xx",
        "num_retries": 1,
        "retry_host_predicate": [
            {
                "name": "envoy.retry_host_predicates.previous_hosts",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.retry.host."
                    "previous_hosts.v3.PreviousHostsPredicate"
                },
            }
        ],
        "host_selection_retry_max_attempts": 3,
        "retry_priority": {
            "name": "envoy.retry_priorities.previous_priorities",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.priority."
                "previous_priorities.v3.PreviousPrioritiesConfig",
                "update_frequency": 1,
            },
        },
    }
    return [
        {
            "match": {
                "prefix": route.path_prefix,
                "headers": [{"name": wire.MODEL_HEADER, "string_match": {"exact": model}}],
            },
            "metadata": {
                "filter_metadata": {
                    wire.METADATA_NAMESPACE: {
                        META_ROUTE: route.name,
                        wire.META_PATH_PREFIX: route.path_prefix,
                    }
                }
            },
            "route": {"cluster": f"llm_{route.name}", "timeout": "10s", "retry_policy": retry},
        }
        for model in route.models
    ]


def _direct_entry(model: str) -> dict[str, Any]:
    """A model route Envoy answers itself (benchmarks: no provider in the way)."""
    return {
        "match": {
            "prefix": "/",
            "headers": [{"name": wire.MODEL_HEADER, "string_match": {"exact": model}}],
        },
        "direct_response": {"status": 200, "body": {"inline_string": "{}"}},
    }


def static_gateway(
    ext_proc_port: int, routes: Sequence[Route], direct_models: Sequence[str] = ()
) -> dict[str, Any]:
    """The whole static config; listener and admin on ports Envoy picks."""
    virtual_host = {
        "name": "sluicegate",
        "domains": ["*"],
        "routes": [
            *(entry for route in routes for entry in _route_entries(route)),
            *(_direct_entry(model) for model in direct_models),
            {
                "match": {"prefix": "/"},
                "direct_response": {"status": 404, "body": {"inline_string": NO_ROUTE_BODY}},
            },
        ],
    }
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {"name": "gateway", "virtual_hosts": [virtual_host]},
        "http_filters": [
            ext_proc_filter(wire.STAGE_ROUTING),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    ext_proc_cluster = {
        "name": wire.EXT_PROC_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": wire.EXT_PROC_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _socket(ext_proc_port)}}]}],
        },
        "typed_extension_protocol_options": {
            HTTP_PROTOCOL_OPTIONS: {
                "@type": f"type.googleapis.com/{HTTP_PROTOCOL_OPTIONS}",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
    }
    return {
        "admin": {"address": _socket(0)},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": _socket(0),
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [ext_proc_cluster, *(_provider_cluster(route) for route in routes)],
        },
    }
