"""Who may call and how much: tenants with their keys, and the admission settings.

Resolved once per load: a tenant's priority class is worked out (its own or the default),
and whether admission is on at all, so neither Envoy's side (xds/translate) nor the
filter's (filters/admission) repeats the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate import config


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    priority: str  # its own class, or admission.default_priority
    models: frozenset[str] | None  # None: every served model
    rate_limits: config.RateLimits | None
    keys: tuple[config.ClientKey, ...]
    # The lane its requests take now, `exact` or `fast`: its own, or admission.lane; for
    # an `auto` tenant the one the control plane's lane steering chose (Gateway.with_lanes).
    lane: config.Lane = "exact"
    # Declared `auto` (docs/fast-lane.md, "The auto lane"): it has the fast lane's
    # buckets and the exact lane's windows whatever its lane, so a move is a push of the
    # key check alone.
    auto: bool = False

    @property
    def fast(self) -> bool:
        """Whether Envoy decides its requests alone now (docs/fast-lane.md)."""
        return self.lane == config.LANE_FAST

    @property
    def in_fast_lane_ever(self) -> bool:
        """Whether its requests may take the fast lane (it has limiter slots)."""
        return self.fast or self.auto

    @property
    def in_exact_lane_ever(self) -> bool:
        """Whether its requests may take the exact lane (the routing stage knows it)."""
        return not self.fast or self.auto

    @property
    def limited(self) -> bool:
        """Whether it or one of its keys has a rate limit."""
        return self.rate_limits is not None or any(k.rate_limits is not None for k in self.keys)


@dataclass(frozen=True, slots=True)
class Admission:
    """The `admission:` section, resolved, and the facts both sides read from it.

    enabled: tenants, rate limits or a concurrency gate exist, so admitted responses carry
    x-ratelimit-* headers from dynamic metadata. keys_required: tenants exist, so the
    routing stage checks a client key on every request under a route prefix, model
    listings included.
    counts_tokens: token limits exist, so real usage is read off responses to reconcile
    reservations (usage observer and usage access log). longest_queue_wait_ms: how long
    the routing stage may hold a request in a priority queue before answering.
    ext_proc_processes: how many ext_proc servers count limits and gates (config rule
    `Config.ext_proc_processes`): each gate's share is its total divided by it.
    routed_by_envoy: some requests take the fast lane (`admission.lane: fast`, or a
    tenant's): Envoy decides them alone (keys, tenants' token buckets, model routing;
    docs/fast-lane.md). routing_stage: some take the exact lane (no fast lane at all, or
    a tenant in the exact lane). The facts above concern the routing stage and its
    requests: the exact lane's tenants and the limits and gates it enforces.
    keys_checked_by_envoy: Envoy checks every client key (tenants exist and each key has
    its secret, as a fast lane requires) and names the client, with its lane, to the
    routing stage, which trusts that instead of a key.
    """

    enabled: bool = False
    keys_required: bool = False
    counts_tokens: bool = False
    longest_queue_wait_ms: int = 0
    priority_classes: tuple[config.PriorityClass, ...] = ()
    default_priority: str = "standard"
    max_queued: int | None = None
    default_max_tokens: int = 1024
    max_output_tokens: int = 1_000_000
    store: config.LimiterStoreConfig = field(default_factory=config.LimiterStoreConfig)
    ext_proc_processes: int = 1
    routed_by_envoy: bool = False
    routing_stage: bool = True
    keys_checked_by_envoy: bool = False
    # When `auto` tenants move between lanes (the control plane's lane steering).
    auto_lane: config.AutoLane = field(default_factory=config.AutoLane)

    @property
    def class_names(self) -> tuple[str, ...]:
        """Priority classes, highest first."""
        return tuple(item.name for item in self.priority_classes)


def resolve_tenants(cfg: config.Config) -> tuple[Tenant, ...]:
    """The declared tenants; an `auto` one starts in the fast lane."""
    return tuple(
        Tenant(
            name=tenant.name,
            priority=cfg.admission.priority_of(tenant),
            models=None if tenant.models is None else frozenset(tenant.models),
            rate_limits=tenant.rate_limits,
            keys=tuple(tenant.keys),
            lane=config.LANE_FAST if lane == config.LANE_AUTO else lane,
            auto=lane == config.LANE_AUTO,
        )
        for tenant in cfg.tenants
        for lane in (cfg.admission.lane_of(tenant),)
    )


def resolve_admission(cfg: config.Config) -> Admission:
    """Admission is on once an exact-lane tenant, a rate limit or a concurrency gate the
    routing stage enforces is declared (validation refuses providers' gates and limits,
    routes' limits beside exact-lane tenants, and a route's gate both lanes reach, in a
    gateway with a fast lane: config rules check_lane and check_fast_lane_gates)."""
    section = cfg.admission
    gated = any(
        route.concurrency is not None and not section.gate_is_envoys(cfg.tenants, route.models)
        for route in cfg.routes
    ) or any(provider.concurrency is not None for provider in cfg.providers)
    waits = [klass.max_wait for klass in section.priority_classes] if gated else []
    # An `auto` tenant is in both lanes' lists: either may decide its requests, and
    # neither lane's filters come or go when it moves (docs/fast-lane.md, "The auto lane").
    exact = [t for t in cfg.tenants if section.lane_of(t) != config.LANE_FAST]
    by_envoy = section.gateway_lane != config.LANE_EXACT or any(
        section.lane_of(t) != config.LANE_EXACT for t in cfg.tenants
    )
    routing_stage = not by_envoy or bool(exact)
    limits = [t.rate_limits for t in exact]
    limits += [key.rate_limits for t in exact for key in t.keys]
    limits += [route.rate_limits for route in cfg.routes]
    limits += [provider.rate_limits for provider in cfg.providers]
    declared = [block for block in limits if block is not None]
    return Admission(
        enabled=routing_stage and (bool(exact) or gated or bool(declared)),
        keys_required=bool(exact),
        counts_tokens=routing_stage
        and any(limit.kind != "requests" for block in declared for limit in block.limits()),
        longest_queue_wait_ms=max(waits, default=0),
        priority_classes=tuple(section.priority_classes),
        default_priority=section.default_priority,
        max_queued=section.max_queued,
        default_max_tokens=section.default_max_tokens,
        max_output_tokens=section.max_output_tokens,
        store=section.store,
        ext_proc_processes=cfg.ext_proc_processes(),
        routed_by_envoy=by_envoy,
        routing_stage=routing_stage,
        # Every key's secret given (a fast lane requires it): Envoy checks the keys
        # whatever the tenants' lanes, so moving one between lanes never adds or removes
        # the check (a request in flight would meet a routing stage that expects the other).
        auto_lane=section.auto_lane,
        keys_checked_by_envoy=bool(cfg.tenants)
        and all(key.secret is not None for t in cfg.tenants for key in t.keys),
    )
