"""sluicegate.filters: the ext_proc server Envoy calls per request and per attempt.

Stages (told apart by the gRPC initial metadata `x-sluicegate-stage`):
  routing  downstream filter; reads the body's `model`, sets `x-sluicegate-model`
           and clears the route cache, or answers 400/404 in OpenAI's format.
  attempt  upstream filter; per provider: maps the model, rewrites `:path`,
           keeps `content-length` right. It never sees a provider key: Envoy's
           credential_injector sets `Authorization` after it, from SDS.
"""

from .attempt import REQUEST_ATTRIBUTES, ROUTE_METADATA_ATTRIBUTE
from .counters import Counters
from .metadata import (
    META_ORIGINAL_PATH,
    META_ROUTE,
    EndpointFacts,
    RouteFacts,
    parse_endpoint_facts,
    parse_route_facts,
    upstream_path,
)
from .server import DEFAULT_MAX_MESSAGE_BYTES, ExtProcServer
from .service import ExtProcService
from .table import RouteInfo, RouteInfoLike, RouteLike, RoutingTable

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "META_ORIGINAL_PATH",
    "META_ROUTE",
    "REQUEST_ATTRIBUTES",
    "ROUTE_METADATA_ATTRIBUTE",
    "Counters",
    "EndpointFacts",
    "ExtProcServer",
    "ExtProcService",
    "RouteFacts",
    "RouteInfo",
    "RouteInfoLike",
    "RouteLike",
    "RoutingTable",
    "parse_endpoint_facts",
    "parse_route_facts",
    "upstream_path",
]
