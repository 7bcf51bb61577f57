"""The fast lane (`admission.lane: fast`; docs/fast-lane.md): requests decided by Envoy alone.

No routing stage runs. With tenants, Envoy's key check (client_keys.py) comes first and
names the client; then Envoy's model reader (model_reader.py, a Lua filter) reads the
body's `model` and `stream` into the `sluicegate` metadata namespace, names the usage
reader in wire.USAGE_HEADER and clears the route cache; the request re-matches here:

- per model, its stream twin (metadata `stream` is `true`) and its plain route, matched
  on metadata `model` instead of the routing stage's headers (streams.py); on a route
  whose gate Envoy enforces in two partitions, each preceded by its twin for the top
  priority class (metadata `priority`), sent at Envoy's HIGH routing priority
  (circuit_breakers.py);
- per prefix, after every model route: each body problem the reader found, answered 400
  as the routing stage words it, a model the tenant may not use, 403, a priority class it
  may not ask for, 400, then a model no route serves, 404; OpenAI error JSON from Envoy
  itself (local_replies.body_refusals, CLIENT_REFUSALS, MODEL_NOT_SERVED).

Between the reader and the router, the limiter slots with the tenants' token buckets,
then the routes' per-model buckets (tenant_limits.py).
"""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2, config_source_pb2, extension_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.http.api_key_auth.v3 import api_key_auth_pb2
from envoy.extensions.filters.http.local_ratelimit.v3.local_rate_limit_pb2 import LocalRateLimit
from envoy.extensions.filters.http.lua.v3 import lua_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import metadata_pb2, string_pb2, value_pb2
from google.protobuf.message import Message

from sluicegate import wire
from sluicegate.local_replies import (
    CLIENT_REFUSALS,
    MODEL_NOT_SERVED,
    BodyRefusal,
    answered_route_name,
    body_refusals,
)
from sluicegate.model import Gateway
from sluicegate.xds.resource import TYPE_PREFIX

from ._proto import ads_source, lua, pack
from .client_keys import CLIENT_KEYS_FILTER, client_keys_config
from .errors_json import error_body, json_reply_headers
from .model_reader import (
    META_BODY_PROBLEM,
    MODEL_READER_FILTER,
    ReaderFacts,
    TenantFacts,
    model_reader_lua,
)
from .native import (
    DYNAMIC_MODULE_FILTER_TYPE_URL,
    NATIVE_MODEL_READER_FILTER,
    native_model_reader,
)
from .tenant_limits import (
    MODEL_LIMITS_FILTER,
    charges_estimates,
    limits_filter_name,
    model_limits_config,
    slot_configs,
)


def key_check_filters(gateway: Gateway) -> list[hcm_pb2.HttpFilter]:
    """Envoy's key check, first of all (client_keys.py), when it checks the keys."""
    if not gateway.admission.keys_checked_by_envoy:
        return []
    return [_discovered(CLIENT_KEYS_FILTER, _type_url(api_key_auth_pb2.ApiKeyAuth))]


def routing_filters(gateway: Gateway) -> list[hcm_pb2.HttpFilter]:
    """For the fast lane's requests, in place of the routing stage: the model reader, the
    limiter slots in order, then the models' buckets (they read what the reader wrote).
    Like the key check, each is discovered by its name over ADS (ECDS): a change to one
    is pushed alone, and leaves the listener and the other filters, with their token
    buckets, as they are. Only names and types here: fast_lane_extensions builds the
    configurations."""
    if not gateway.admission.routed_by_envoy:
        return []
    slots = range(gateway.limit_slots.count)
    reader = (
        _discovered(MODEL_READER_FILTER, _type_url(lua_pb2.Lua))
        if gateway.native_module is None
        else _discovered(NATIVE_MODEL_READER_FILTER, DYNAMIC_MODULE_FILTER_TYPE_URL)
    )
    return [
        reader,
        *(_discovered(limits_filter_name(slot), _type_url(LocalRateLimit)) for slot in slots),
        _discovered(MODEL_LIMITS_FILTER, _type_url(LocalRateLimit)),
    ]


def _type_url(config_type: type[Message]) -> str:
    return TYPE_PREFIX + config_type.DESCRIPTOR.full_name


def _discovered(name: str, type_url: str) -> hcm_pb2.HttpFilter:
    """The filter `name`, whose configuration (always of `type_url`: Envoy refuses
    another type under the same name) comes over ADS."""
    return hcm_pb2.HttpFilter(
        name=name,
        config_discovery=config_source_pb2.ExtensionConfigSource(
            config_source=ads_source(), type_urls=[type_url]
        ),
    )


def fast_lane_extensions(gateway: Gateway) -> list[extension_pb2.TypedExtensionConfig]:
    """The configurations key_check_filters' and routing_filters' filters discover
    (ECDS), sorted by name."""
    configs: list[tuple[str, Message]] = []
    if gateway.admission.keys_checked_by_envoy:
        configs.append((CLIENT_KEYS_FILTER, client_keys_config(gateway)))
    if gateway.admission.routed_by_envoy:
        facts = reader_facts(gateway)
        if gateway.native_module is None:
            configs.append((MODEL_READER_FILTER, lua(model_reader_lua(facts))))
        else:
            reader = native_model_reader(gateway.native_module, facts)
            configs.append((NATIVE_MODEL_READER_FILTER, reader))
        configs += slot_configs(gateway)
        configs.append((MODEL_LIMITS_FILTER, model_limits_config(gateway)))
    return [
        extension_pb2.TypedExtensionConfig(name=name, typed_config=pack(config))
        for name, config in sorted(configs, key=lambda item: item[0])
    ]


def reader_facts(gateway: Gateway) -> ReaderFacts:
    """What the model reader is configured with for `gateway`."""
    fast = [t for t in gateway.tenants if t.in_fast_lane_ever]
    return ReaderFacts(
        gateway.admission.default_max_tokens,
        gateway.admission.max_output_tokens,
        # Every tenant, whatever its lane: moving one between lanes changes only the key
        # check.
        {t.name: TenantFacts(t.priority, t.models, t.auto) for t in gateway.tenants},
        estimates=charges_estimates(fast, gateway.routes),
        asks_usage=frozenset(
            model
            for model, routes in gateway.served.items()
            if all(route.asks_stream_usage for route in routes)
        ),
        classes=gateway.admission.class_names,
        held=frozenset(gateway.held_models)
        if any(t.auto for t in gateway.tenants)
        else frozenset(),
        # Gateway.scenarios hold the default one: more means a client may choose.
        scenarios=len(gateway.scenarios) > 1,
    )


def _metadata_match(key: str, value: value_pb2.ValueMatcher) -> metadata_pb2.MetadataMatcher:
    return metadata_pb2.MetadataMatcher(
        filter=wire.METADATA_NAMESPACE,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key=key)],
        value=value,
    )


def model_routes(
    plain: rc.Route, twin: rc.Route, model: str, top_class: str | None = None
) -> list[rc.Route]:
    """A model's stream twin and plain route (streams.py) matched on the metadata the model
    reader wrote instead of the routing stage's headers; with `top_class` (a gate Envoy
    enforces, model.EnvoyGate), each first for that class's requests at Envoy's HIGH
    routing priority, whose circuit breakers hold the class's share of the gate."""
    exact = value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=model))
    by_model = _metadata_match(wire.META_MODEL, exact)
    streamed = _metadata_match(wire.META_STREAM, value_pb2.ValueMatcher(bool_match=True))
    top = (
        None
        if top_class is None
        else _metadata_match(
            wire.META_PRIORITY,
            value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=top_class)),
        )
    )
    routes = []
    for base, matches in ((twin, [by_model, streamed]), (plain, [by_model])):
        route = rc.Route()
        route.CopyFrom(base)
        route.match.ClearField("headers")
        del route.request_headers_to_remove[:]
        route.match.dynamic_metadata.extend(matches)
        if top is not None:
            high = rc.Route()
            high.CopyFrom(route)
            high.match.dynamic_metadata.append(top)
            high.route.priority = base_pb2.HIGH
            routes.append(high)
        routes.append(route)
    return routes


def answered_routes(prefix: str, max_output_tokens: int) -> list[rc.Route]:
    """Under `prefix`, after every model route: each body error (local_replies.
    body_refusals), each refusal of the client (CLIENT_REFUSALS), then a model no route
    serves."""
    routes = [
        _json_reply(
            prefix,
            error,
            _metadata_match(
                META_BODY_PROBLEM,
                value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=error.problem)),
            ),
        )
        for error in (*body_refusals(max_output_tokens), *CLIENT_REFUSALS)
    ]
    served = _metadata_match(wire.META_MODEL, value_pb2.ValueMatcher(present_match=True))
    routes.append(_json_reply(prefix, MODEL_NOT_SERVED, served))
    return routes


def _json_reply(prefix: str, error: BodyRefusal, match: metadata_pb2.MetadataMatcher) -> rc.Route:
    body = error_body(error.message, error.type, error.code, error.param)
    return rc.Route(
        name=answered_route_name(error),
        match=rc.RouteMatch(prefix=prefix, dynamic_metadata=[match]),
        direct_response=rc.DirectResponseAction(
            status=error.status, body=base_pb2.DataSource(inline_string=body.decode())
        ),
        response_headers_to_add=json_reply_headers(),
    )
