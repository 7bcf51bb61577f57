"""sluicegate.filters: the ext_proc server Envoy calls per request and per attempt.

Stages (told apart by the gRPC initial metadata `x-sluicegate-stage`):
  routing  downstream filter; checks the request headers' count and size (431) and
           declared length (413), the client key (401), reads the body's `model`,
           sets `x-sluicegate-model` and clears the route cache, or answers 400/404 in
           OpenAI's format; with admission configured also 403, reserves tokens on every
           applicable limit (429) and waits for a priority-gate slot (503 when shed).
  usage    downstream observer (observability mode: Envoy never waits); reads the real
           token usage off each response and reconciles the admission reservation.
  error_body  downstream, only a provider's error answer that is not JSON (Envoy's
           matcher skips the rest): wraps it in OpenAI's error JSON, status and text kept.
  attempt  upstream filter; per provider: maps the model, rewrites `:path`,
           keeps `content-length` right. It never sees a provider key: Envoy's
           credential_injector sets `Authorization` after it, from SDS.
"""

from .admission import (
    AdmissionController,
    AdmissionMetrics,
    AdmissionPolicy,
    KeyRing,
    admission_policy,
)
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
from .table import RouteInfo, RoutingTable

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "META_ORIGINAL_PATH",
    "META_ROUTE",
    "REQUEST_ATTRIBUTES",
    "ROUTE_METADATA_ATTRIBUTE",
    "AdmissionController",
    "AdmissionMetrics",
    "AdmissionPolicy",
    "Counters",
    "EndpointFacts",
    "ExtProcServer",
    "ExtProcService",
    "KeyRing",
    "RouteFacts",
    "RouteInfo",
    "RoutingTable",
    "admission_policy",
    "parse_endpoint_facts",
    "parse_route_facts",
    "upstream_path",
]
