"""Pure translation: validated config → Envoy xDS resources. No I/O, no clock, no DNS.

    ir = build_ir(config, api_keys)     # resolve every derived fact once (ir.py)
    resources = translate(ir)           # {type URL: [message, …]}, each list sorted by name

Output is deterministic (stable names, sorted wherever order carries no meaning), so golden
files stay stable and a content hash changes only when the config really changed. Hash
with `SerializeToString(deterministic=True)`: metadata Structs are protobuf maps.

`served_models` and `models_list_json` give the ext_proc filter and the HTTP side the same
view of models that Envoy's routes encode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from google.protobuf.message import Message

from sluicegate import wire

from .clusters import build_clusters
from .endpoints import build_endpoints
from .ir import (
    BackendIR,
    GatewayIR,
    LimitsIR,
    ListenerIR,
    ProviderIR,
    RouteIR,
    TlsIR,
    TranslateError,
    build_ir,
    normalize_path_prefix,
)
from .listeners import build_listeners
from .memo import RouteMemo
from .routes import build_route_configurations
from .secrets import CREDENTIALS_FILTER, build_secrets, secret_name

LISTENER: Final = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE: Final = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER: Final = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
# Provider keys (SDS); clusters name them, so they go first.
SECRET: Final = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
# Make-before-break push order (DESIGN.md xDS rule 12): SDS, CDS, EDS, LDS, RDS.
TYPE_URLS: Final = (SECRET, CLUSTER, ENDPOINT, LISTENER, ROUTE)

__all__ = [
    "CLUSTER",
    "CREDENTIALS_FILTER",
    "ENDPOINT",
    "LISTENER",
    "ROUTE",
    "SECRET",
    "TYPE_URLS",
    "BackendIR",
    "GatewayIR",
    "LimitsIR",
    "ListenerIR",
    "ProviderIR",
    "RouteIR",
    "RouteMemo",
    "ServedModel",
    "TlsIR",
    "TranslateError",
    "build_ir",
    "build_secrets",
    "models_list_json",
    "normalize_path_prefix",
    "resource_name",
    "routing_table_entries",
    "secret_name",
    "served_models",
    "translate",
]


def translate(ir: GatewayIR, memo: RouteMemo | None = None) -> dict[str, list[Message]]:
    """All resources, keyed by type URL (every key present, lists sorted by name).

    ENDPOINT holds assignments only for EDS clusters; DNS clusters carry theirs inline.
    SECRET holds the provider keys the clusters name (secrets.py); nothing else does.
    With a `memo` (the control plane keeps one across reloads), unchanged routes reuse
    their resources from the previous call: same output, far less work (memo.py).
    """
    resources: dict[str, list[Message]] = {
        SECRET: list(build_secrets(ir)),
        CLUSTER: list(build_clusters(ir, memo)),
        ENDPOINT: list(build_endpoints(ir, memo)),
        LISTENER: list(build_listeners(ir)),
        ROUTE: list(build_route_configurations(ir, memo)),
    }
    if memo is not None:
        memo.finish()
    return resources


def resource_name(type_url: str, resource: Message) -> str:
    """The name xDS uses for `resource` (ClusterLoadAssignment names by cluster_name)."""
    field = "cluster_name" if type_url == ENDPOINT else "name"
    name = getattr(resource, field)
    assert isinstance(name, str)
    return name


@dataclass(frozen=True, slots=True)
class ServedModel:
    """Where a model is served: what the routing stage needs to pick and label a route."""

    route: str  # config route name
    path_prefix: str  # normalised, ends with "/"
    cluster: str  # Envoy cluster name
    providers: tuple[str, ...]  # provider names, by (priority, name)

    def matches(self, path: str) -> bool:
        """True when a request path falls under this route's prefix."""
        return path.startswith(self.path_prefix)


def served_models(ir: GatewayIR) -> dict[str, tuple[ServedModel, ...]]:
    """Model → the routes serving it, in route order (first match wins), sorted by model.

    One model can be served under several path prefixes by different routes, hence a tuple;
    pick the first entry whose `matches(path)` is true.
    """
    served: dict[str, list[ServedModel]] = {}
    for entry, route in _served(ir):
        for model in route.models:
            served.setdefault(model, []).append(entry)
    return {model: tuple(served[model]) for model in sorted(served)}


def _served(ir: GatewayIR) -> list[tuple[ServedModel, RouteIR]]:
    return [
        (
            ServedModel(
                route=route.name,
                path_prefix=route.path_prefix,
                cluster=route.cluster_name,
                providers=tuple(backend.provider.name for backend in route.backends),
            ),
            route,
        )
        for route in ir.routes
    ]


def models_list_json(ir: GatewayIR, path_prefix: str | None = None) -> bytes:
    """OpenAI's `GET /v1/models` body: every served model, or those under `path_prefix`."""
    prefix = normalize_path_prefix(path_prefix) if path_prefix is not None else None
    return wire.models_list_body(
        model
        for route in ir.routes
        if prefix is None or route.path_prefix == prefix
        for model in route.models
    )


def routing_table_entries(ir: GatewayIR) -> list[tuple[str, ServedModel]]:
    """(model, where it is served) pairs in Envoy's match order: route order, then each
    route's models as configured. A model served under several prefixes appears once per
    route; a consumer keeping one entry per model should keep the first."""
    return [(model, served) for served, route in _served(ir) for model in route.models]
