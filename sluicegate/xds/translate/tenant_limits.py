"""Tenants' and keys' rate limits as Envoy token buckets (the fast lane; docs/fast-lane.md,
"Limits").

A fixed number of `local_ratelimit` filters, `sluicegate.limits.<slot>`, each holding at
most one tenant's buckets (its own limits and its keys'; model/limit_slots.py says which
slot): Envoy rebuilds a limiter's buckets whenever its config changes, so changing,
adding or removing one tenant never refills another's. An empty slot is a limiter
enabled for no request. Each filter makes, per limit kind and scope, a descriptor from
the metadata the model reader wrote (`limit`, `tenant`, and `key` for a key's limits);
it matches only its own tenant's descriptors, so another tenant's request passes it.

A request the model reader routes is charged (it then writes wire.META_CHARGED_TENANT; a
listing or a refused body is not): 1 against `requests`, and its estimate (the model
reader's, as the routing stage estimates) against `tokens`, `input_tokens` and
`output_tokens` (hits_addend from the metadata). Buckets are all or nothing each, and
refuse with 429 and `local_rate_limited` details (local_replies.FAST_LANE_REFUSALS).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Final

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.extensions.filters.http.local_ratelimit.v3 import local_rate_limit_pb2
from envoy.type.metadata.v3 import metadata_pb2
from envoy.type.v3 import percent_pb2, token_bucket_pb2
from google.protobuf import duration_pb2, wrappers_pb2

from sluicegate import config, wire
from sluicegate.model import Gateway, Route, Tenant

from ._proto import set_headers

LIMITS_FILTER_PREFIX: Final = "sluicegate.limits."
# The routes' per-model limits, in one filter of their own (a change to them refills
# only their buckets); always in a fast-lane listener, so adding them changes no listener.
MODEL_LIMITS_FILTER: Final = "sluicegate.model_limits"
LIMITS_EXTENSION: Final = "envoy.filters.http.local_ratelimit"
MIN_FILL_MS: Final = config.FAST_LANE_MIN_FILL_MS
# What each kind is charged, from the model reader's metadata (None: 1 per request).
CHARGES: Final[dict[config.LimitKind, str | None]] = {
    "requests": None,
    "tokens": wire.META_ESTIMATE_TOKENS,
    "input_tokens": wire.META_ESTIMATE_INPUT,
    "output_tokens": wire.META_ESTIMATE_OUTPUT,
}
_LIMIT, _TENANT, _KEY, _ROUTE, _MODEL = "limit", "tenant", "key", "route", "model"


def limits_filter_name(slot: int) -> str:
    return f"{LIMITS_FILTER_PREFIX}{slot}"


def slot_configs(gateway: Gateway) -> list[tuple[str, local_rate_limit_pb2.LocalRateLimit]]:
    """(filter name, config) per slot: its tenant's buckets, or none."""
    tenants = {tenant.name: tenant for tenant in gateway.tenants}
    slots = gateway.limit_slots
    configs = []
    for slot in range(slots.count):
        held = slots.tenant_in(slot)
        config = (
            local_rate_limit_pb2.LocalRateLimit(stat_prefix=f"sluicegate_limits_slot_{slot}")
            if held is None
            else tenant_limits_config(
                tenants[held],
                gateway.admission.auto_lane if tenants[held].auto else None,
            )
        )
        configs.append((limits_filter_name(slot), config))
    return configs


def charges_estimates(tenants: Iterable[Tenant], routes: Iterable[Route] = ()) -> bool:
    """Whether any of their buckets (the tenants', the routes' per-model ones) counts
    tokens: the model reader then writes each request's estimate."""
    limits = [limit for t in tenants for _, limit in _scoped_limits(t)]
    limits += [limit for route in routes for limit in _route_limits(route)]
    return any(limit.kind != "requests" for limit in limits)


def model_limits_config(gateway: Gateway) -> local_rate_limit_pb2.LocalRateLimit:
    """Each route's per-model limits (`routes[].rate_limits`: every model of the route
    counted apart), a descriptor (limit kind, route, model) each: the route from the model
    route's own metadata (routes.py), the model from the model reader's. Enabled for no
    request when no route has limits. No x-ratelimit-* of its own: an answer carries one
    set, the tenant's buckets'."""
    buckets = [
        ((_entry(_ROUTE, route.name), _entry(_MODEL, model)), limit)
        for route in gateway.routes
        for model in route.models
        for limit in _route_limits(route)
    ]
    route_name = rc.RateLimit.Action(
        metadata=rc.RateLimit.Action.MetaData(
            descriptor_key=_ROUTE,
            metadata_key=_metadata_key(wire.META_ROUTE),
            source=rc.RateLimit.Action.MetaData.ROUTE_ENTRY,
            skip_if_absent=True,  # a route that is no model's (an answered refusal)
        )
    )
    entities = [route_name, _from_metadata(_MODEL, wire.META_MODEL)]
    return _limiter("sluicegate_model_limits", entities, [], buckets, x_ratelimit_headers=False)


def _route_limits(route: Route) -> list[config.Limit]:
    return [] if route.rate_limits is None else route.rate_limits.limits()


def token_bucket(
    limit: int, window_ms: int, capacity: int | None = None
) -> token_bucket_pb2.TokenBucket:
    """`limit` per `window_ms` as a bucket of `limit` tokens (or `capacity`) refilled in
    equal parts, as often as whole divisions allow but at most once every MIN_FILL_MS:
    the refill rate is exactly the limit's. A full bucket plus a window's refills admits
    up to twice the limit in one window (docs/fast-lane.md, "What each lane
    guarantees")."""
    most = max(1, min(limit, window_ms // MIN_FILL_MS))
    fills = next(d for d in range(most, 0, -1) if limit % d == 0)
    return token_bucket_pb2.TokenBucket(
        max_tokens=limit if capacity is None else capacity,
        tokens_per_fill=wrappers_pb2.UInt32Value(value=limit // fills),
        fill_interval=_duration_ns(window_ms * 1_000_000 // fills),
    )


def tenant_limits_config(
    tenant: Tenant, auto_lane: config.AutoLane | None = None
) -> local_rate_limit_pb2.LocalRateLimit:
    """The tenant's filter: a descriptor (limit kind, tenant[, key]) per limit. An `auto`
    tenant's buckets (`auto_lane` given) hold AutoLane.bucket_size of each limit: it comes
    back to the fast lane with up to `fast_below` of a window used, so a full bucket
    would let one window admit more than the limit (docs/fast-lane.md, "The auto lane")."""
    buckets = [
        ((_entry(_TENANT, tenant.name), *(() if key is None else (_entry(_KEY, key),))), limit)
        for key, limit in _scoped_limits(tenant)
    ]
    tenant_action = _from_metadata(_TENANT, wire.META_CHARGED_TENANT)
    key_action = _from_metadata(_KEY, wire.META_KEY_NAME)
    return _limiter(
        f"sluicegate_limits_{tenant.name}",
        [tenant_action],
        [tenant_action, key_action],
        buckets,
        x_ratelimit_headers=True,
        bucket_size=None if auto_lane is None else auto_lane.bucket_size,
    )


Bucket = tuple[tuple[ratelimit_pb2.RateLimitDescriptor.Entry, ...], config.Limit]


def _limiter(
    stat_prefix: str,
    entities: list[rc.RateLimit.Action],
    keyed_entities: list[rc.RateLimit.Action],
    buckets: list[Bucket],
    *,
    x_ratelimit_headers: bool,
    bucket_size: Callable[[int], int] | None = None,
) -> local_rate_limit_pb2.LocalRateLimit:
    """A limiter enforced for every request, with a bucket per (entries, limit): its
    descriptors are (limit kind, *entities), and (limit kind, *keyed_entities) for
    buckets with more entries (a key's). Without buckets, enabled for no request. A
    refusal's Retry-After is the slowest refill among the buckets: when a refused
    request may find its bucket refilled (one larger than a refill waits longer)."""
    if not buckets:
        return local_rate_limit_pb2.LocalRateLimit(stat_prefix=stat_prefix)
    shapes = sorted({(limit.kind, len(entries)) for entries, limit in buckets})
    slowest_ms = max(
        int(token_bucket(limit.limit, limit.window_ms).fill_interval.ToMilliseconds())
        for _, limit in buckets
    )
    always = config_percent()
    limiter = local_rate_limit_pb2.LocalRateLimit(
        stat_prefix=stat_prefix,
        filter_enabled=always,
        filter_enforced=always,
        rate_limits=[
            _descriptor_source(kind, entities if size == len(entities) else keyed_entities)
            for kind, size in shapes
        ],
        descriptors=[
            ratelimit_pb2.LocalRateLimitDescriptor(
                entries=[_entry(_LIMIT, limit.kind), *entries],
                token_bucket=token_bucket(
                    limit.limit,
                    limit.window_ms,
                    None if bucket_size is None else bucket_size(limit.limit),
                ),
            )
            for entries, limit in buckets
        ],
        response_headers_to_add=set_headers(
            ("retry-after", str(max(1, math.ceil(slowest_ms / 1000)))),
            (wire.REFUSAL_HEADER, "rate_limit_exceeded"),
        ),
    )
    if x_ratelimit_headers:
        limiter.enable_x_ratelimit_headers = ratelimit_pb2.DRAFT_VERSION_03
    return limiter


def config_percent() -> base_pb2.RuntimeFractionalPercent:
    """100 % (the filter's default is 0 %: enabled for no request)."""
    return base_pb2.RuntimeFractionalPercent(
        default_value=percent_pb2.FractionalPercent(numerator=100),
        runtime_key="sluicegate.fast_lane.limits",
    )


def _scoped_limits(tenant: Tenant) -> list[tuple[str | None, config.Limit]]:
    """(key name or None for the tenant's own, limit) for every limit set."""
    scoped: list[tuple[str | None, config.Limit]] = []
    if tenant.rate_limits is not None:
        scoped += [(None, limit) for limit in tenant.rate_limits.limits()]
    for key in tenant.keys:
        if key.rate_limits is not None:
            scoped += [(key.name, limit) for limit in key.rate_limits.limits()]
    return scoped


def _entry(key: str, value: str) -> ratelimit_pb2.RateLimitDescriptor.Entry:
    return ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)


def _descriptor_source(kind: config.LimitKind, entities: list[rc.RateLimit.Action]) -> rc.RateLimit:
    """(limit kind, *entities) for each request; charged 1, or the request's estimate for a
    token kind (the model reader's metadata)."""
    kind_action = rc.RateLimit.Action(
        generic_key=rc.RateLimit.Action.GenericKey(descriptor_key=_LIMIT, descriptor_value=kind)
    )
    source = rc.RateLimit(actions=[kind_action, *entities])
    charge = CHARGES[kind]
    if charge is not None:
        source.hits_addend.format = f"%DYNAMIC_METADATA({wire.METADATA_NAMESPACE}:{charge})%"
    return source


def _metadata_key(key: str) -> metadata_pb2.MetadataKey:
    return metadata_pb2.MetadataKey(
        key=wire.METADATA_NAMESPACE, path=[metadata_pb2.MetadataKey.PathSegment(key=key)]
    )


def _from_metadata(descriptor_key: str, metadata_key: str) -> rc.RateLimit.Action:
    return rc.RateLimit.Action(
        metadata=rc.RateLimit.Action.MetaData(
            descriptor_key=descriptor_key,
            metadata_key=_metadata_key(metadata_key),
            source=rc.RateLimit.Action.MetaData.DYNAMIC,
            # Without it (a request the model reader did not route), no descriptor.
            skip_if_absent=True,
        )
    )


def _duration_ns(nanoseconds: int) -> duration_pb2.Duration:
    seconds, nanos = divmod(nanoseconds, 1_000_000_000)
    return duration_pb2.Duration(seconds=seconds, nanos=nanos)
