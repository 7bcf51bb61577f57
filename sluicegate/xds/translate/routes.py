"""Route configurations: `routes-<listener>` per listener, one virtual host for every domain.

Order (first match wins):
1. Model listings, per distinct route prefix P: `GET P models` and `GET P models/<id>`,
   answered by Envoy itself (direct_response) with ext_proc disabled: no Python involved.
   With client keys (tenants) ext_proc stays on there: it checks the key, and answers a
   tenant limited to some models with its own list.
2. Per route, per model: prefix P and header wire.MODEL_HEADER == model → cluster
   `route-<name>`. The header is set only by the routing-stage ext_proc, which then
   clears the route cache so the request re-matches here. Each carries the route's
   timeouts (timeouts.py: `timeout` is always written, as Envoy's 15 s default would cut
   long generations) and retry policy (retries.py); `auto_host_rewrite` sends each attempt with
   the chosen provider's Host. The path prefix is rewritten here only when every provider
   of the route shares one URL prefix; otherwise the attempt-stage ext_proc rewrites it
   per provider (header_mutation cannot set `:path`). Each is preceded by its stream
   twin (streams.py): the same route plus a match on wire.STREAM_HEADER, which the
   routing stage sets on streamed requests, waiting timeouts.first_token per attempt.
3. Per route prefix P, a fallback `P` → 404 that keeps ext_proc enabled. Every request
   first matches a route *before* the model header exists, and ext_proc takes its
   per-route settings from that first match: requests under a route prefix must first
   land on a route where ext_proc runs, or they would never be routed by model.
4. Catch-all `/` → 404 with ext_proc disabled: paths outside every prefix (scanners, typos)
   cost no Python. Omitted when a route's prefix is "/" (its fallback covers everything).
404 bodies are plain text; the listener's local_reply_config turns them into OpenAI errors.

For the fast lane's requests (`lane: fast`, envoy_routing.py), 2 also matches the
metadata Envoy's model reader wrote (instead of the headers, or beside them when some
tenants are in the exact lane; with a twin of each for the top priority class before it
where Envoy enforces the route's gate in two partitions), and before each prefix's
fallback (3) come its
`answered-<problem>` routes: the body problems the reader found (400), a model the
tenant may not use (403) and a model no route serves (404).
"""

from __future__ import annotations

from functools import partial

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import wrappers_pb2
from google.protobuf.wrappers_pb2 import UInt32Value

from sluicegate import wire
from sluicegate.model import Gateway, Route, match_order

from ._ext_proc import EXT_PROC_FILTER
from ._proto import pack, struct
from .envoy_routing import answered_routes, model_routes
from .errors_json import NO_MODEL_ROUTE_MESSAGE, UNKNOWN_PATH_MESSAGE, json_reply_headers
from .faults import FAULT_FILTER, route_fault
from .memo import RouteMemo
from .retries import retry_policy
from .streams import with_stream_twin
from .timeouts import apply_route_timeouts

VIRTUAL_HOST = "sluicegate"
# Route-level metadata: lets the attempt-stage ext_proc (attribute xds.route_metadata) and
# access logs know the route and its prefix without asking the control plane.
META_ROUTE = "route"

_EXT_PROC_DISABLED = pack(ext_proc_pb2.ExtProcPerRoute(disabled=True))


def build_route_configurations(
    gateway: Gateway, memo: RouteMemo | None = None
) -> list[route_pb2.RouteConfiguration]:
    """The same routes for every listener, under each listener's RDS name."""
    routes = _routes(gateway, memo)
    virtual_host = rc.VirtualHost(
        name=VIRTUAL_HOST,
        domains=["*"],
        routes=routes,
        response_headers_to_add=admission_response_headers() if gateway.admission.enabled else [],
        # The routing stage's word on who reads the usage, and the client Envoy's key check
        # named, are not for providers.
        request_headers_to_remove=[wire.USAGE_HEADER, wire.CLIENT_HEADER],
        # Only this gateway says a refusal is its own, or how long a request queued: a
        # provider's (or another sluicegate's upstream) never reaches the client. Envoy
        # removes these before it adds its own, and local replies keep theirs.
        response_headers_to_remove=[
            wire.REFUSAL_HEADER,
            wire.QUEUE_MS_HEADER,
            *_providers_quota_headers(gateway),
        ],
    )
    return [
        route_pb2.RouteConfiguration(
            name=listener.route_config_name,
            virtual_hosts=[virtual_host],
            max_direct_response_body_size_bytes=_largest_direct_body(routes),
        )
        for listener in gateway.listeners
    ]


def _providers_quota_headers(gateway: Gateway) -> list[str]:
    """With fast-lane tenants, a provider's OpenAI `x-ratelimit-*` headers (its quota for
    the gateway's key, shared by every tenant) are removed: a client's quota is the
    gateway's, which the exact lane sets again from its metadata (admission_response_
    headers) and the fast lane's buckets give in Envoy's own names (docs/fast-lane.md)."""
    admission = gateway.admission
    if not (admission.routed_by_envoy and admission.keys_checked_by_envoy):
        return []
    return [header for header, _ in wire.RATELIMIT_HEADERS]


def admission_response_headers() -> list[base_pb2.HeaderValueOption]:
    """OpenAI's x-ratelimit-* headers and wire.QUEUE_MS_HEADER on admitted responses, from
    the dynamic metadata the admission stage set: no response-phase round trip to Python.
    A request that no limit applied to has no x-ratelimit-* metadata, the value formats
    empty, and Envoy then adds nothing (keep_empty_value is false), so a provider's own
    headers pass through. When the gateway has limits its values replace the provider's:
    the client's quota is the gateway's."""
    from_metadata = [*wire.RATELIMIT_HEADERS, (wire.QUEUE_MS_HEADER, wire.META_QUEUE_MS)]
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(
                key=header, value=f"%DYNAMIC_METADATA({wire.METADATA_NAMESPACE}:{key})%"
            ),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for header, key in from_metadata
    ]


def _largest_direct_body(routes: list[rc.Route]) -> UInt32Value:
    """Envoy NACKs a RouteConfiguration whose direct response body exceeds 4 KiB unless
    told otherwise; the /v1/models list passes that at about 55 models."""
    largest = max(
        (len(r.direct_response.body.inline_string.encode()) for r in routes
         if r.HasField("direct_response")),
        default=0,
    )  # fmt: skip
    return UInt32Value(value=max(4096, largest))


def _routes(gateway: Gateway, memo: RouteMemo | None = None) -> list[rc.Route]:
    routes: list[rc.Route] = []
    for prefix in gateway.path_prefixes:
        models = sorted(gateway.models_under(prefix))
        keyed = gateway.admission.keys_required
        routes.append(_json_route(f"{prefix}models", wire.models_list_body(models), keyed=keyed))
        for model in models:
            path = f"{prefix}models/{model}"
            build = partial(_model_listing, path, model, keyed=keyed)
            routes.append(build() if memo is None else memo.reuse(("listing", path, keyed), build))
    by_headers, by_envoy = gateway.admission.routing_stage, gateway.admission.routed_by_envoy
    for route, route_models in match_order(gateway.routes):
        build = partial(
            _model_routes, route, route_models, by_headers=by_headers, by_metadata=by_envoy
        )
        routes.extend(
            build()
            if memo is None
            else memo.get(("model_routes", by_headers, by_envoy), route, gateway.limits, build)
        )
    # Longest prefix first, so the most specific fallback is the one first matched.
    for prefix in sorted(gateway.path_prefixes, key=lambda p: (-len(p), p)):
        if by_envoy:
            routes.extend(answered_routes(prefix, gateway.admission.max_output_tokens))
        routes.append(_not_found(prefix, ext_proc=True))
    if "/" not in gateway.path_prefixes:
        routes.append(_not_found("/", ext_proc=False))
    return routes


def _not_found(prefix: str, *, ext_proc: bool) -> rc.Route:
    route = rc.Route(
        name=wire.NOT_FOUND_ROUTE,
        match=rc.RouteMatch(prefix=prefix),
        direct_response=rc.DirectResponseAction(
            status=404,
            body=base_pb2.DataSource(
                inline_string=NO_MODEL_ROUTE_MESSAGE if ext_proc else UNKNOWN_PATH_MESSAGE
            ),
        ),
    )
    if not ext_proc:
        route.typed_per_filter_config[EXT_PROC_FILTER].CopyFrom(_EXT_PROC_DISABLED)
    return route


def _model_listing(path: str, model: str, *, keyed: bool) -> rc.Route:
    return _json_route(path, wire.model_body(model), keyed=keyed)


def _json_route(path: str, body: bytes, *, keyed: bool) -> rc.Route:
    """GET `path` → 200 with a fixed JSON body. Without client keys, ext_proc is disabled
    (no Python involved); with them, ext_proc checks the key first and answers a tenant
    limited to some models itself."""
    route = rc.Route(
        name=wire.MODELS_ROUTE,
        match=rc.RouteMatch(
            path=path,
            headers=[
                rc.HeaderMatcher(name=":method", string_match=string_pb2.StringMatcher(exact="GET"))
            ],
        ),
        direct_response=rc.DirectResponseAction(
            status=200, body=base_pb2.DataSource(inline_string=body.decode())
        ),
        # Also marks the reply as JSON for local_reply_config's pass-through mapper.
        response_headers_to_add=json_reply_headers(),
    )
    if not keyed:
        route.typed_per_filter_config[EXT_PROC_FILTER].CopyFrom(_EXT_PROC_DISABLED)
    return route


def _model_routes(
    route: Route, models: tuple[str, ...], *, by_headers: bool, by_metadata: bool
) -> list[rc.Route]:
    """Per model its stream twin and plain route, matched on the routing stage's headers
    (`by_headers`: the exact lane's requests), and on the metadata Envoy read from the
    body (`by_metadata`: the fast lane's; envoy_routing.py)."""
    routes: list[rc.Route] = []
    for model in models:
        twin, plain = with_stream_twin(_model_route(route, model), route)
        if by_headers:
            routes.extend((twin, plain))
        if by_metadata:
            gate = route.envoy_gate
            routes.extend(model_routes(plain, twin, model, gate.top_class if gate else None))
    return routes


def _model_route(route: Route, model: str) -> rc.Route:
    action = rc.RouteAction(
        cluster=route.cluster_name,
        auto_host_rewrite=wrappers_pb2.BoolValue(value=True),
    )
    apply_route_timeouts(action, route)
    policy = retry_policy(route)
    if policy is not None:
        action.retry_policy.CopyFrom(policy)
    rewrite = route.prefix_rewrite
    if rewrite is not None:
        action.prefix_rewrite = rewrite
    per_filter = {} if route.fault is None else {FAULT_FILTER: pack(route_fault(route.fault))}
    return rc.Route(
        name=route.name,
        typed_per_filter_config=per_filter,
        match=rc.RouteMatch(
            prefix=route.path_prefix,
            headers=[
                rc.HeaderMatcher(
                    name=wire.MODEL_HEADER, string_match=string_pb2.StringMatcher(exact=model)
                )
            ],
        ),
        route=action,
        metadata=base_pb2.Metadata(
            filter_metadata={
                wire.METADATA_NAMESPACE: struct(
                    {META_ROUTE: route.name, wire.META_PATH_PREFIX: route.path_prefix}
                )
            }
        ),
    )
