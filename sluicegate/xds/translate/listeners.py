"""Listeners: one per config listener, each an HTTP connection manager fed routes over RDS.

Filter chain: with a fast lane, Envoy's key check and the model reader first
(envoy_routing.py); ext_proc (routing stage: admission and model routing) → usage readers
(with token limits the ext_proc usage observer for large JSON answers; json_to_metadata
for small ones; a Lua filter and sse_to_metadata for streams; usage.py) → fault → error
bodies (a provider's non-JSON error answer wrapped in OpenAI's error JSON;
error_bodies.py) → router.
The routing stage reads the buffered body, sets the model header and clears the route
cache, so the request re-matches a per-model route (routes.py). Because the body is
buffered by ext_proc, the listener's per-connection buffer limit is the request body
limit: above it Envoy answers 413.

`local_reply_config` makes every reply Envoy makes itself (404 catch-all, 413, 503, 504,
ext_proc failure 500) an OpenAI error object. Local replies that are *already* JSON
(direct responses such as `/v1/models`, the filter's immediate responses) also pass through
`local_reply_config` in Envoy, so the first mapper recognises them by their
`content-type: application/json` response header (a CEL filter; checked on Envoy 1.40,
where the plain access-log filters cannot see response headers) and passes the body
through unchanged. Whoever answers with JSON must therefore set that content type.
"""

from __future__ import annotations

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import (
    address_pb2,
    base_pb2,
    extension_pb2,
    protocol_pb2,
    substitution_format_string_pb2,
)
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.connection_limit.v3 import connection_limit_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.formatter.req_without_query.v3 import req_without_query_pb2
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import (
    header_mutation_pb2 as early_header_mutation_pb2,
)
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import any_pb2, wrappers_pb2
from xds.type.matcher.v3 import string_pb2 as xds_string_pb2

from sluicegate import wire
from sluicegate.config import LANE_FAST
from sluicegate.local_replies import (
    FAST_LANE_REFUSALS,
    FAULT_CODE,
    FAULT_FLAG,
    OVERLOAD_CODE,
    OVERLOAD_FLAG,
    EnvoyRefusal,
)
from sluicegate.model import Admission, Gateway, Limits, Listener

from ._ext_proc import EXT_PROC_FILTER, ext_proc_config
from ._proto import (
    Predicate,
    ads_source,
    composite_filter,
    duration_ms,
    duration_s,
    not_predicate,
    pack,
    request_header_tree,
    set_headers,
    struct,
)
from .envoy_routing import key_check_filters, routing_filters
from .error_bodies import error_body_filter
from .errors_json import LOCAL_REPLY_ERRORS, LocalReplyError, error_struct
from .faults import fault_http_filter
from .record_log import lane_access_logs, latency_access_log, record_access_log
from .upstream_errors import UPSTREAM_ERRORS, UpstreamError
from .usage import usage_filters

HCM_FILTER = "envoy.filters.network.http_connection_manager"
CONNECTION_LIMIT_FILTER = "envoy.filters.network.connection_limit"
ENVOY_HEADER_PREFIX = "x-envoy-"
ROUTER_FILTER = "envoy.filters.http.router"
# The composite filter's action that makes the routing stage's filter (beside a fast lane).
ROUTING_STAGE_ACTION = "sluicegate.routing_stage"
STREAM_IDLE_TIMEOUT_S = 300

# The first local-reply mapper: replies that already carry a JSON body are left alone.
JSON_REPLY_EXPRESSION = (
    "'content-type' in response.headers"
    " && response.headers['content-type'].startsWith('application/json')"
)
_JSON = "application/json"


def build_listeners(gateway: Gateway) -> list[listener_pb2.Listener]:
    """One Listener per config listener, sorted by name."""
    learns = any(route.learns_weights for route in gateway.routes)
    return [_listener(listener, gateway, learns) for listener in gateway.listeners]


def _listener(listener: Listener, gateway: Gateway, learns_weights: bool) -> listener_pb2.Listener:
    limits = gateway.limits
    return listener_pb2.Listener(
        name=listener.resource_name,
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(
                address=listener.address, port_value=listener.port
            )
        ),
        per_connection_buffer_limit_bytes=wrappers_pb2.UInt32Value(
            value=limits.max_request_body_bytes
        ),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    _connection_limit(listener, limits),
                    listener_components_pb2.Filter(
                        name=HCM_FILTER,
                        typed_config=pack(
                            _http_connection_manager(listener, gateway, learns_weights)
                        ),
                    ),
                ]
            )
        ],
    )


def _connection_limit(listener: Listener, limits: Limits) -> listener_components_pb2.Filter:
    """Open client connections per listener: one more is closed as soon as it is accepted
    (no HTTP answer: none is possible before a request; counted in Envoy's
    `connection_limit.<listener>.limited_connections`). A filter rather than the
    listener's runtime limit because it comes with the listener over LDS, so a reload
    changes it. A reload that changes the listener builds a new filter chain, whose
    count starts from its own connections while the old ones drain."""
    limit = connection_limit_pb2.ConnectionLimit(
        stat_prefix=listener.name,
        max_connections=wrappers_pb2.UInt64Value(value=limits.max_connections_per_listener),
    )
    return listener_components_pb2.Filter(name=CONNECTION_LIMIT_FILTER, typed_config=pack(limit))


def request_timeout_ms(limits: Limits, admission: Admission) -> int:
    """HCM `request_timeout`: the client's `limits.request_timeout` to send its request,
    plus the time the routing stage may hold the body (each queue wait and the ext_proc
    answer), so a request the gateway queues is never cut by it. 0 stays off.

    Envoy disarms this timer once the request is fully decoded (all filters done, the last
    byte on its way upstream) or the response starts (checked on Envoy 1.40), so it never
    cuts a long generation; route timeouts own that.
    """
    if limits.request_timeout_ms == 0:
        return 0
    held_ms = 2 * admission.longest_queue_wait_ms + wire.QUEUE_MARGIN_MS
    return limits.request_timeout_ms + held_ms + limits.ext_proc_message_timeout_ms


def _http_filters(gateway: Gateway) -> list[hcm_pb2.HttpFilter]:
    """Envoy's key check (with a fast lane and tenants) → the fast lane's model reader and
    limiter slots (envoy_routing.py) → ext_proc routing (the exact lane's admission) →
    usage readers → fault → error bodies → router."""
    limits, admission = gateway.limits, gateway.admission
    filters = key_check_filters(gateway)
    # The fast lane's filters leave an exact-lane client's request alone, and come first:
    # the model reader may pass an `auto` tenant's request to the routing stage by its
    # model (model_reader.py).
    if admission.routed_by_envoy:  # Envoy decides the fast lane's requests itself
        filters += routing_filters(gateway)
    if admission.routing_stage:
        # The routing stage writes dynamic metadata on every request (the request record's
        # facts, and with admission the reservation and the x-ratelimit-* values); Envoy
        # drops what a filter may not write into a namespace.
        routing = ext_proc_config(
            wire.STAGE_ROUTING,
            limits,
            metadata_namespaces=(wire.METADATA_NAMESPACE,),
            reads_metadata=False,
            longest_queue_wait_ms=admission.longest_queue_wait_ms,
        )
        filters.append(_routing_stage_filter(pack(routing), gateway))
    filters.extend(
        usage_filters(
            limits, counts_tokens=admission.counts_tokens, native_module=gateway.native_module
        )
    )
    # After ext_proc: a drill applies to the route the model header selected.
    filters.append(fault_http_filter())
    # Last before the router, so first on the way back: the observer and json_to_metadata
    # see a provider's error answer as the client will.
    filters.append(error_body_filter(limits))
    # suppress_envoy_headers: Envoy adds x-envoy-* request headers (x-envoy-original-host,
    # …) after every upstream filter, so only the router can keep them from providers
    # (docs/architecture.md, "What a provider receives").
    router = router_pb2.Router(suppress_envoy_headers=True)
    filters.append(hcm_pb2.HttpFilter(name=ROUTER_FILTER, typed_config=pack(router)))
    return filters


def _routing_stage_filter(config: any_pb2.Any, gateway: Gateway) -> hcm_pb2.HttpFilter:
    """The routing stage's filter; beside a fast lane, Envoy's composite filter, which
    makes it only for a request whose client is not a fast-lane one (Envoy's key check
    names those with the `fast/` prefix, client_keys.py): an ext_proc filter made for
    every request and then skipped cost an auto tenant's fast-lane requests about as much
    as the rest of the auto lane in Envoy (benchmarks/RESULTS.md, "The auto lane's part
    in Envoy, arm by arm")."""
    if not (gateway.admission.routed_by_envoy and gateway.admission.keys_checked_by_envoy):
        return hcm_pb2.HttpFilter(name=EXT_PROC_FILTER, typed_config=config)
    not_fast = not_predicate(
        Predicate(
            single_predicate=Predicate.SinglePredicate(
                input=request_header_tree(wire.CLIENT_HEADER).input,
                value_match=xds_string_pb2.StringMatcher(prefix=f"{LANE_FAST}/"),
            )
        )
    )
    return composite_filter(EXT_PROC_FILTER, config, ROUTING_STAGE_ACTION, not_fast)


def _http_connection_manager(
    listener: Listener, gateway: Gateway, learns_weights: bool
) -> hcm_pb2.HttpConnectionManager:
    limits, admission = gateway.limits, gateway.admission
    steered = any(tenant.auto for tenant in gateway.tenants)  # the auto lane's
    return hcm_pb2.HttpConnectionManager(
        stat_prefix=listener.name,
        rds=hcm_pb2.Rds(
            config_source=ads_source(),
            route_config_name=listener.route_config_name,
        ),
        # A gateway is the edge: trust the peer address, not client-sent XFF. A sidecar
        # sits behind its app and keeps the app's headers.
        use_remote_address=wrappers_pb2.BoolValue(value=listener.role == "gateway"),
        # LLM streams pause for long (reasoning models); say the 5 min idle limit out loud.
        stream_idle_timeout=duration_s(STREAM_IDLE_TIMEOUT_S),
        # Slowloris and slow bodies: a request must arrive in time. Neither timer runs
        # once the request is in, so neither caps a generation (route timeouts own that).
        request_headers_timeout=duration_ms(limits.request_headers_timeout_ms),
        request_timeout=duration_ms(request_timeout_ms(limits, admission)),
        # A client's limits are checked by the routing stage (filters/request_limits.py);
        # Envoy's are higher by what the gateway adds after it (wire.py), so Envoy never
        # fails a valid request for headers the gateway itself added.
        common_http_protocol_options=protocol_pb2.HttpProtocolOptions(
            max_headers_count=wrappers_pb2.UInt32Value(
                value=wire.MAX_REQUEST_HEADERS + wire.REQUEST_HEADERS_HEADROOM
            )
        ),
        max_request_headers_kb=wrappers_pb2.UInt32Value(
            value=wire.MAX_REQUEST_HEADERS_KB + wire.REQUEST_HEADERS_HEADROOM_KB
        ),
        # "/v1/../admin" or "//v1" must not dodge the route prefixes.
        normalize_path=wrappers_pb2.BoolValue(value=True),
        merge_slashes=True,
        early_header_mutation_extensions=[_strip_internal_headers()],
        http_filters=_http_filters(gateway),
        local_reply_config=local_reply_config(
            limits, fast_lane=admission.routed_by_envoy or admission.keys_checked_by_envoy
        ),
        # Every request's record: /metrics, the JSON access log, and the charge of its
        # reservation (docs/metrics.md).
        # With a `routing: latency` route, the records of those routes also go to the
        # control plane (record_log.py, docs/latency-routing.md); with an `auto` tenant,
        # the records of its requests (docs/fast-lane.md, "The auto lane").
        access_log=[
            record_access_log(in_flight=steered),
            *([latency_access_log(in_flight=steered)] if learns_weights else []),
            *(lane_access_logs() if steered else []),
        ],
        # With an auto tenant, Envoy also logs each request while it runs (record_log.py).
        access_log_options=hcm_pb2.HttpConnectionManager.HcmAccessLogOptions(
            access_log_flush_interval=duration_ms(wire.IN_FLIGHT_FLUSH_MS)
        )
        if steered
        else None,
    )


def _strip_internal_headers() -> extension_pb2.TypedExtensionConfig:
    """Remove a client-sent model header and x-envoy-* headers before routing and before
    any filter.

    Routes match on wire.MODEL_HEADER, which only the routing stage may set. A request
    without a body never reaches ext_proc (body-only mode), so a client that sent the
    header itself would otherwise be routed to a provider without any check.

    Envoy's router obeys request headers such as x-envoy-max-retries,
    x-envoy-upstream-rq-timeout-ms and x-envoy-retry-on from clients it considers internal
    (loopback and private addresses by default): a client could raise its own retries or
    lift the configured timeouts. Retries and timeouts are the gateway's policy, so every
    x-envoy-* header from a client is dropped.
    """
    return extension_pb2.TypedExtensionConfig(
        name="envoy.http.early_header_mutation.header_mutation",
        typed_config=pack(
            early_header_mutation_pb2.HeaderMutation(
                mutations=[
                    mutation_rules_pb2.HeaderMutation(remove=wire.MODEL_HEADER),
                    mutation_rules_pb2.HeaderMutation(remove=wire.USAGE_HEADER),
                    mutation_rules_pb2.HeaderMutation(remove=wire.STREAM_HEADER),
                    mutation_rules_pb2.HeaderMutation(remove=wire.CLIENT_HEADER),
                    mutation_rules_pb2.HeaderMutation(
                        remove_on_match=mutation_rules_pb2.HeaderMutation.RemoveOnMatch(
                            key_matcher=string_pb2.StringMatcher(prefix=ENVOY_HEADER_PREFIX)
                        )
                    ),
                ]
            )
        ),
    )


def local_reply_config(limits: Limits, *, fast_lane: bool = False) -> hcm_pb2.LocalReplyConfig:
    """OpenAI error bodies for Envoy's own replies; JSON replies pass through unchanged.

    In the fast lane, the refusals of Envoy's key check and token buckets come first, by
    their details (local_replies.FAST_LANE_REFUSALS). Upstream failures (timeouts,
    overflow, no healthy provider …) are matched next, by response code details or flags,
    each with its own `code` (upstream_errors.py); the rest by status.
    """
    mappers = [_json_passthrough_mapper()]
    if fast_lane:
        mappers += [_fast_lane_mapper(refusal) for refusal in FAST_LANE_REFUSALS]
    mappers += [_fault_mapper(), _overload_mapper()]
    mappers.extend(_upstream_error_mapper(error) for error in UPSTREAM_ERRORS)
    for error in LOCAL_REPLY_ERRORS:
        if error.status == 413:
            error = LocalReplyError(
                413,
                error.type,
                error.code,
                f"Request body is larger than the gateway's limit of "
                f"{limits.max_request_body_bytes} bytes",
            )
        mapper = hcm_pb2.ResponseMapper(
            filter=_status_filter(error.status, error.status),
            body_format_override=_error_format(error.message, error.type, error.code),
        )
        if error.answered_as is not None:
            mapper.status_code.value = error.answered_as
        mappers.append(mapper)
    mappers.append(
        hcm_pb2.ResponseMapper(
            filter=_status_filter(400, 499),
            body_format_override=_error_format("%LOCAL_REPLY_BODY%", "invalid_request_error", None),
        )
    )
    return hcm_pb2.LocalReplyConfig(
        mappers=mappers,
        body_format=_error_format("%LOCAL_REPLY_BODY%", "server_error", None),
    )


def _fast_lane_mapper(refusal: EnvoyRefusal) -> hcm_pb2.ResponseMapper:
    return hcm_pb2.ResponseMapper(
        filter=_cel_filter(f"response.code_details == '{refusal.details}'"),
        body_format_override=_error_format(refusal.message, refusal.type, refusal.code),
        headers_to_add=set_headers(*refusal.headers),
    )


def _fault_mapper() -> hcm_pb2.ResponseMapper:
    """A drill's abort (flag FI) keeps its status and says it was a drill."""
    return hcm_pb2.ResponseMapper(
        filter=accesslog_pb2.AccessLogFilter(
            response_flag_filter=accesslog_pb2.ResponseFlagFilter(flags=[FAULT_FLAG])
        ),
        body_format_override=_error_format(
            "Aborted by a fault-injection drill on this route (fault.abort)",
            "server_error",
            FAULT_CODE,
        ),
    )


def _overload_mapper() -> hcm_pb2.ResponseMapper:
    """Envoy's overload manager shed the request (flag OM: heap near its budget): a 503
    that says so, with Retry-After, instead of the generic server error."""
    return hcm_pb2.ResponseMapper(
        filter=accesslog_pb2.AccessLogFilter(
            response_flag_filter=accesslog_pb2.ResponseFlagFilter(flags=[OVERLOAD_FLAG])
        ),
        status_code=wrappers_pb2.UInt32Value(value=503),
        body_format_override=_error_format(
            "The gateway is overloaded; retry later", "server_error", OVERLOAD_CODE
        ),
        headers_to_add=set_headers(("retry-after", "1"), (wire.REFUSAL_HEADER, OVERLOAD_CODE)),
    )


def _json_passthrough_mapper() -> hcm_pb2.ResponseMapper:
    return hcm_pb2.ResponseMapper(
        filter=accesslog_pb2.AccessLogFilter(
            extension_filter=accesslog_pb2.ExtensionFilter(
                name="envoy.access_loggers.extension_filters.cel",
                typed_config=pack(cel_pb2.ExpressionFilter(expression=JSON_REPLY_EXPRESSION)),
            )
        ),
        body_format_override=substitution_format_string_pb2.SubstitutionFormatString(
            text_format_source=base_pb2.DataSource(inline_string="%LOCAL_REPLY_BODY%"),
            content_type=_JSON,
            omit_empty_values=True,
        ),
    )


def _cel_filter(expression: str) -> accesslog_pb2.AccessLogFilter:
    return accesslog_pb2.AccessLogFilter(
        extension_filter=accesslog_pb2.ExtensionFilter(
            name="envoy.access_loggers.extension_filters.cel",
            typed_config=pack(cel_pb2.ExpressionFilter(expression=expression)),
        )
    )


def _upstream_error_mapper(error: UpstreamError) -> hcm_pb2.ResponseMapper:
    if error.details is not None:
        match = _cel_filter(error.details)
    else:
        match = accesslog_pb2.AccessLogFilter(
            response_flag_filter=accesslog_pb2.ResponseFlagFilter(flags=list(error.flags))
        )
    mapper = hcm_pb2.ResponseMapper(
        filter=match,
        status_code=wrappers_pb2.UInt32Value(value=error.status),
        body_format_override=_error_format(
            f"{error.message} (%RESPONSE_CODE_DETAILS%)", "server_error", error.code
        ),
    )
    headers = []
    if error.retry_after_s is not None:
        headers.append(("retry-after", str(error.retry_after_s)))
    if error.refusal:
        headers.append((wire.REFUSAL_HEADER, error.code))
    mapper.headers_to_add.extend(set_headers(*headers))
    return mapper


def _status_filter(low: int, high: int) -> accesslog_pb2.AccessLogFilter:
    """Status in [low, high]. The runtime keys are never set; they only satisfy the API."""

    def compare(op: int, value: int) -> accesslog_pb2.AccessLogFilter:
        return accesslog_pb2.AccessLogFilter(
            status_code_filter=accesslog_pb2.StatusCodeFilter(
                comparison=accesslog_pb2.ComparisonFilter(
                    op=op,
                    value=base_pb2.RuntimeUInt32(
                        default_value=value, runtime_key=f"sluicegate.local_reply.status_{value}"
                    ),
                )
            )
        )

    if low == high:
        return compare(accesslog_pb2.ComparisonFilter.EQ, low)
    return accesslog_pb2.AccessLogFilter(
        and_filter=accesslog_pb2.AndFilter(
            filters=[
                compare(accesslog_pb2.ComparisonFilter.GE, low),
                compare(accesslog_pb2.ComparisonFilter.LE, high),
            ]
        )
    )


def _error_format(
    message: str, type_: str, code: str | None
) -> substitution_format_string_pb2.SubstitutionFormatString:
    formatters = []
    if "%REQ_WITHOUT_QUERY(" in message:
        formatters.append(
            extension_pb2.TypedExtensionConfig(
                name="envoy.formatter.req_without_query",
                typed_config=pack(req_without_query_pb2.ReqWithoutQuery()),
            )
        )
    return substitution_format_string_pb2.SubstitutionFormatString(
        json_format=struct(error_struct(message, type_, code)),
        content_type=_JSON,
        formatters=formatters,
    )
