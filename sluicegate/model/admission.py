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
    routed_by_envoy: `lane: fast`: Envoy decides every request alone (keys, tenants'
    token buckets, model routing), and no routing stage runs (docs/fast-lane.md); the
    facts above that concern the routing stage (enabled, keys_required, counts_tokens,
    longest_queue_wait_ms) are then off.
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

    @property
    def class_names(self) -> tuple[str, ...]:
        """Priority classes, highest first."""
        return tuple(item.name for item in self.priority_classes)


def resolve_tenants(cfg: config.Config) -> tuple[Tenant, ...]:
    return tuple(
        Tenant(
            name=tenant.name,
            priority=cfg.admission.priority_of(tenant),
            models=None if tenant.models is None else frozenset(tenant.models),
            rate_limits=tenant.rate_limits,
            keys=tuple(tenant.keys),
        )
        for tenant in cfg.tenants
    )


def resolve_admission(cfg: config.Config) -> Admission:
    """Admission is on once any tenant, rate limit or concurrency gate is declared."""
    section = cfg.admission
    gated = any(route.concurrency is not None for route in cfg.routes) or any(
        provider.concurrency is not None for provider in cfg.providers
    )
    waits = [klass.max_wait for klass in section.priority_classes] if gated else []
    # Validation refuses `fast` with what Envoy cannot enforce (config rule check_lane).
    by_envoy = section.lane == config.LANE_FAST
    enabled = (bool(cfg.tenants) or gated or bool(cfg.declared_rate_limits())) and not by_envoy
    return Admission(
        enabled=enabled,
        keys_required=bool(cfg.tenants) and not by_envoy,
        counts_tokens=cfg.counts_tokens() and not by_envoy,
        longest_queue_wait_ms=max(waits, default=0),
        priority_classes=tuple(section.priority_classes),
        default_priority=section.default_priority,
        max_queued=section.max_queued,
        default_max_tokens=section.default_max_tokens,
        max_output_tokens=section.max_output_tokens,
        store=section.store,
        ext_proc_processes=cfg.ext_proc_processes(),
        routed_by_envoy=by_envoy,
    )
