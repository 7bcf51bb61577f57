"""The resolved model of one config load: what Envoy's resources and the ext_proc
server's routing table and admission policy are all made from.

    gateway = build_model(config, api_keys)   # once per load (stack/)
    resources = translate(gateway)            # xds/translate: Envoy resources only
    server.load(gateway)                      # filters: routing table, admission policy

`build_model` takes a Config that passed validation (`config.load_config`, which runs
every rule spanning sections, with file and line): it checks nothing again. Everything
here is pure: no environment, no files, no clock. Provider keys arrive in `api_keys`.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Final, Literal

from sluicegate import config

from .admission import Admission, Tenant, resolve_admission, resolve_tenants
from .limit_slots import LimitSlots, assign_slots
from .providers import Provider, resolve_provider
from .routes import Route, first_match, match_order, resolve_route

Role = Literal["gateway", "sidecar"]

LISTENER_PREFIX: Final = "listener-"
ROUTE_CONFIG_PREFIX: Final = "routes-"


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    address: str
    port: int
    role: Role

    @property
    def resource_name(self) -> str:
        return f"{LISTENER_PREFIX}{self.name}"

    @property
    def route_config_name(self) -> str:
        return f"{ROUTE_CONFIG_PREFIX}{self.name}"


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_body_bytes: int
    ext_proc_message_timeout_ms: int
    # Slow and abusive clients (config.Limits); 0 turns a timeout off.
    request_headers_timeout_ms: int = 10_000
    request_timeout_ms: int = 60_000
    max_connections_per_listener: int = 10_000


@dataclass(frozen=True)
class Gateway:
    """Everything one config load resolves to. Listeners and providers are sorted by
    name; routes keep config order because the first matching route wins."""

    listeners: tuple[Listener, ...]
    providers: tuple[Provider, ...]
    routes: tuple[Route, ...]
    limits: Limits
    admission: Admission = field(default_factory=Admission)
    tenants: tuple[Tenant, ...] = ()
    # Providers out of rotation: drained live or marked `drain: true` in the file.
    drained: frozenset[str] = frozenset()
    # Said once per load, logged by the caller: routes a drain could not apply to.
    warnings: tuple[str, ...] = ()
    # Every scenario a request may be reported under: config.DEFAULT_SCENARIO first, then
    # the declared ones in file order (docs/configuration.md, "Scenarios").
    scenarios: tuple[str, ...] = (config.DEFAULT_SCENARIO,)
    # Where the structured access log goes: config.ACCESS_LOG_STDOUT, an absolute file
    # path, or None for no access log.
    access_log: str | None = None
    # Client key name -> the key, for the keys Envoy checks itself in the fast lane
    # (config.resolve_client_keys). Never printed.
    client_keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    # In the fast lane, the limiter filter holding each limited tenant's buckets.
    limit_slots: LimitSlots = field(default_factory=LimitSlots)
    # The control plane's gRPC address as dialled on this machine (`sluicegate.xds`): where
    # the ext_proc servers send their usage notes of `auto` tenants' requests
    # (sluicegate.lanes), unless told another (`sluicegate ext-proc --control-plane`).
    # Empty: none (a Gateway not built from a config).
    control_plane: str = ""
    # The path of sluicegate's native filters library as Envoy loads it (the control
    # plane resolves config.native_filters: sluicegate.native), or None for Envoy's own
    # filters (docs/native-filters.md).
    native_module: str | None = None

    @cached_property
    def path_prefixes(self) -> tuple[str, ...]:
        """Distinct route prefixes, sorted: each gets its own `<prefix>models` listing."""
        return tuple(sorted({route.path_prefix for route in self.routes}))

    @cached_property
    def served(self) -> Mapping[str, tuple[Route, ...]]:
        """Model → the routes serving it, in match order (routes.match_order), sorted by
        model. Several routes serve one model only under different path prefixes."""
        served: dict[str, list[Route]] = {}
        for route, models in match_order(self.routes):
            for model in models:
                served.setdefault(model, []).append(route)
        return {model: tuple(served[model]) for model in sorted(served)}

    @cached_property
    def held_models(self) -> Mapping[str, str]:
        """Models an `auto` tenant's requests for take the exact lane, whatever its lane,
        with why: those served by a route held there (Route.held_in_exact_lane) under any
        prefix; sorted by model."""
        held = {}
        for model, routes in self.served.items():
            reasons = [why for route in routes if (why := route.held_in_exact_lane)]
            if reasons:
                held[model] = reasons[0]
        return held

    def with_weights(self, weights: Mapping[str, Mapping[str, int]]) -> Gateway:
        """This gateway with learned provider weights (route -> provider -> weight) on its
        `routing: latency` routes; static routes, and names it lacks, are left alone. Pure:
        the control plane passes the weights in as data, as it passes drains to
        `build_model` (docs/latency-routing.md)."""
        routes = tuple(
            route.with_weights(weights[route.name])
            if route.learns_weights and route.name in weights
            else route
            for route in self.routes
        )
        if all(new is old for new, old in zip(routes, self.routes, strict=True)):
            return self
        return replace(self, routes=routes)

    def with_lanes(self, lanes: Mapping[str, config.Lane]) -> Gateway:
        """This gateway with its `auto` tenants in the lanes the control plane's lane
        steering chose (tenant -> `fast` or `exact`; sluicegate.lanes); other tenants, and
        names it lacks, are left alone. Pure, as `with_weights` (docs/fast-lane.md, "The
        auto lane")."""
        tenants = tuple(
            replace(tenant, lane=lanes[tenant.name])
            if tenant.auto and lanes.get(tenant.name, tenant.lane) != tenant.lane
            else tenant
            for tenant in self.tenants
        )
        if all(new is old for new, old in zip(tenants, self.tenants, strict=True)):
            return self
        return replace(self, tenants=tenants)

    def route_for(self, model: str, path: str | None) -> Route | None:
        """The route Envoy picks for `model` at `path` (routes.first_match)."""
        return first_match(self.served.get(model, ()), path)

    def models_under(self, path_prefix: str | None = None) -> tuple[str, ...]:
        """Models served under `path_prefix` (any form: "/v1" is "/v1/"), or every served
        model, in match order without repeats: what `<prefix>models` lists."""
        prefix = None if path_prefix is None else config.normalize_path_prefix(path_prefix)
        return tuple(
            dict.fromkeys(
                model
                for route, models in match_order(self.routes)
                if prefix is None or route.path_prefix == prefix
                for model in models
            )
        )


def build_model(
    cfg: config.Config,
    api_keys: Mapping[str, str | None],
    drained: AbstractSet[str] = frozenset(),
    client_keys: Mapping[str, str] | None = None,
    limit_slots: LimitSlots | None = None,
    native_module: str | None = None,
) -> Gateway:
    """Resolve a validated `cfg` into a `Gateway`.

    `api_keys` maps a provider name to its resolved key (config.resolve_api_keys reads
    env vars and files; the model stays pure). A provider whose key is absent, None or
    empty gets no Authorization header upstream; the client's own is removed either way.
    `drained` names providers taken out of rotation live (`sluicegate drain`); those
    marked `drain: true` in the file are added (routes.resolve_route says how).
    `client_keys` maps a client key's name to the key itself, for those with a `secret`
    (config.resolve_client_keys, which checks each against its hash): the fast lane's.
    `limit_slots` are the last published ones, which limited tenants keep
    (limit_slots.assign_slots). `native_module` is the native filters library Envoy loads
    (sluicegate.native.resolve_module), or None.
    """
    providers = {p.name: resolve_provider(p, api_keys.get(p.name)) for p in cfg.providers}
    drained = set(drained) | {p.name for p in cfg.providers if p.drain}
    resolved = [
        resolve_route(route, providers, cfg.defaults, cfg.admission, cfg.tenants, drained)
        for route in cfg.routes
    ]
    admission = resolve_admission(cfg)
    tenants = resolve_tenants(cfg)
    slots = (
        assign_slots((t.name for t in tenants if t.limited and t.in_fast_lane_ever), limit_slots)
        if admission.routed_by_envoy
        else LimitSlots()
    )
    return Gateway(
        listeners=tuple(
            sorted(
                (Listener(x.name, x.address, x.port, x.role) for x in cfg.listeners),
                key=lambda item: item.name,
            )
        ),
        providers=tuple(providers[name] for name in sorted(providers)),
        routes=tuple(route for route, _ in resolved),
        limits=Limits(
            max_request_body_bytes=cfg.limits.max_request_body_bytes,
            ext_proc_message_timeout_ms=cfg.limits.ext_proc_message_timeout_ms,
            request_headers_timeout_ms=cfg.limits.request_headers_timeout,
            request_timeout_ms=cfg.limits.request_timeout,
            max_connections_per_listener=cfg.limits.max_connections_per_listener,
        ),
        admission=admission,
        tenants=tenants,
        drained=frozenset(drained),
        warnings=tuple(warning for _, warning in resolved if warning is not None),
        scenarios=tuple(dict.fromkeys((config.DEFAULT_SCENARIO, *cfg.scenarios))),
        access_log=None if cfg.access_log is None else cfg.access_log.path,
        client_keys=dict(client_keys or {}),
        limit_slots=slots,
        control_plane=config.reachable(cfg.sluicegate.xds),
        native_module=native_module,
    )
