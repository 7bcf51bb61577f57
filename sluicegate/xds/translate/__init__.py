"""Pure translation: the resolved model → Envoy xDS resources. No I/O, no clock, no DNS.

    gateway = build_model(config, api_keys)   # sluicegate.model: every derived fact, once
    resources = translate(gateway)            # {type URL: [message, …]}, each list sorted by name

Output is deterministic (stable names, sorted wherever order carries no meaning), so golden
files stay stable and a content hash changes only when the config really changed. Hash
with `SerializeToString(deterministic=True)`: metadata Structs are protobuf maps.
"""

from __future__ import annotations

from google.protobuf.message import Message

from sluicegate import wire
from sluicegate.model import Gateway
from sluicegate.xds.resource import (
    CLUSTER,
    ENDPOINT,
    EXTENSION_CONFIG,
    LISTENER,
    ROUTE,
    SECRET,
    resource_name,
)

from .clusters import build_clusters
from .endpoints import build_endpoints
from .envoy_routing import fast_lane_extensions
from .listeners import build_listeners
from .memo import RouteMemo
from .routes import build_route_configurations
from .secrets import CREDENTIALS_FILTER, build_secrets, secret_name

__all__ = [
    "CLUSTER",
    "CREDENTIALS_FILTER",
    "ENDPOINT",
    "EXTENSION_CONFIG",
    "LISTENER",
    "NATIVE_TYPES",
    "ROUTE",
    "SECRET",
    "RouteMemo",
    "build_secrets",
    "models_list_json",
    "resource_name",
    "secret_name",
    "translate",
    "translate_native",
]


def translate(gateway: Gateway, memo: RouteMemo | None = None) -> dict[str, list[Message]]:
    """All resources, keyed by type URL (every key present, lists sorted by name).

    ENDPOINT holds assignments only for EDS clusters; DNS clusters carry theirs inline.
    SECRET holds the provider keys the clusters name (secrets.py); nothing else does.
    EXTENSION_CONFIG holds the fast lane's filter configurations (envoy_routing.py).
    With a `memo` (the control plane keeps one across reloads), unchanged routes reuse
    their resources from the previous call: same output, far less work (memo.py).
    """
    resources: dict[str, list[Message]] = {
        SECRET: list(build_secrets(gateway)),
        EXTENSION_CONFIG: list(fast_lane_extensions(gateway)),
        CLUSTER: list(build_clusters(gateway, memo)),
        ENDPOINT: list(build_endpoints(gateway, memo)),
        LISTENER: list(build_listeners(gateway)),
        ROUTE: list(build_route_configurations(gateway, memo)),
    }
    if memo is not None:
        memo.finish()
    return resources


# The resource types that differ between two gateways that differ only in `native_module`.
NATIVE_TYPES = (CLUSTER, LISTENER, EXTENSION_CONFIG)


def translate_native(gateway: Gateway, memo: RouteMemo | None = None) -> dict[str, list[Message]]:
    """`translate(gateway)`'s NATIVE_TYPES alone: the clusters (what a provider receives),
    the listeners (the usage reader) and the fast lane's filter configurations (the model
    reader), the only resources that differ between two gateways that differ only in
    `native_module`, so an Envoy with the native library is served those
    (stack/native_nodes.py; tests/stack/test_native_nodes.py checks that nothing else
    differs). A `memo` reuses unchanged routes' clusters, as in translate()."""
    resources: dict[str, list[Message]] = {
        CLUSTER: list(build_clusters(gateway, memo)),
        EXTENSION_CONFIG: list(fast_lane_extensions(gateway)),
        LISTENER: list(build_listeners(gateway)),
    }
    if memo is not None:
        memo.finish()
    return resources


def models_list_json(gateway: Gateway, path_prefix: str | None = None) -> bytes:
    """OpenAI's `GET /v1/models` body: every served model, or those under `path_prefix`:
    the body Envoy's listing routes answer with (routes.py)."""
    return wire.models_list_body(gateway.models_under(path_prefix))
