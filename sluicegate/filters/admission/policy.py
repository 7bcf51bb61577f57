"""The admission policy: the config's tenants, limits and gates, resolved for the filter.

Built once per config load (pure, from the resolved model) and swapped whole on reload,
like the routing table: a request reads one consistent policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from sluicegate.config import DEFAULT_SCENARIO, Concurrency, RateLimits
from sluicegate.model import Gateway, gate_name

from ..limiter import Limit, OnFailure
from ..queueing import ClassPolicy, GatePolicy
from .keyring import ClientIdentity, KeyRing

# Scopes of the limits the filter reserves on (they appear in messages and store keys).
SCOPE_TENANT: Final = "tenant"
SCOPE_KEY: Final = "key"
SCOPE_MODEL: Final = "model"
SCOPE_PROVIDER: Final = "provider"
# A class with max_wait 0 never queues; the gate still needs a positive wait.
_NO_WAIT_S: Final = 0.001


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    name: str
    priority: str
    allowed_models: frozenset[str] | None  # None: every served model
    limits: tuple[Limit, ...]
    # Declared `auto` (model.Tenant.auto): its requests' records say so (record.py), and
    # those Envoy admitted in the fast lane are charged into its windows here (charge.py).
    auto: bool = False


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    name: str
    default_max_tokens: int
    # Names of the gates a request takes, in this order: the route's, then its provider's.
    gates: tuple[str, ...] = ()
    model_limits: Mapping[str, tuple[Limit, ...]] = field(default_factory=dict)
    # The limits of the route's provider when it sends to that provider alone.
    provider_limits: tuple[Limit, ...] = ()
    # What its requests are reported as unless the client picks another (record.py).
    scenario: str = DEFAULT_SCENARIO
    # A stream's usage event may be asked for (model.Route.asks_stream_usage).
    asks_stream_usage: bool = True


@dataclass(frozen=True, slots=True)
class StoreSettings:
    kind: str = "memory"
    url: str | None = None
    key_prefix: str = "sluicegate"
    timeout_s: float = 0.1
    on_failure: OnFailure = "local"
    replicas: int = 1


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """Everything the admission stage decides with. `keyring` None: no tenants are
    declared, the gateway is open (no key checked, none removed)."""

    keyring: KeyRing | None = None
    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)
    key_limits: Mapping[str, tuple[Limit, ...]] = field(default_factory=dict)
    classes: tuple[str, ...] = ("interactive", "standard", "batch")
    default_priority: str = "standard"
    routes: Mapping[str, RoutePolicy] = field(default_factory=dict)
    gates: Mapping[str, GatePolicy] = field(default_factory=dict)
    default_max_tokens: int = 1024
    max_output_tokens: int = 1_000_000
    store: StoreSettings = StoreSettings()
    # Token limits exist, so the gateway reads usage off responses: the usage observer
    # (streams) and the usage access log (JSON answers) are configured (xds usage.py).
    counts_tokens: bool = False
    # Envoy checks the keys and names the client (a gateway with a fast lane): trusted.
    keys_checked_by_envoy: bool = False
    # Every scenario a client may pick with wire.SCENARIO_HEADER (the declared ones and
    # DEFAULT_SCENARIO).
    scenarios: frozenset[str] = frozenset((DEFAULT_SCENARIO,))
    # Whether any request needs more than model routing; read on every ext_proc message,
    # so worked out once here rather than over every route each time.
    enabled: bool = field(init=False)

    def __post_init__(self) -> None:
        enabled = self.keyring is not None or any(
            route.gates or route.model_limits or route.provider_limits
            for route in self.routes.values()
        )
        object.__setattr__(self, "enabled", enabled)

    def limits_for(
        self, identity: ClientIdentity | None, route: str, model: str
    ) -> tuple[Limit, ...]:
        """Every limit a request reserves on: its tenant's, its key's, its model's."""
        found: tuple[Limit, ...] = () if identity is None else self.client_limits(identity)
        route_policy = self.routes.get(route)
        if route_policy is not None:
            found += route_policy.model_limits.get(model, ())
            found += route_policy.provider_limits
        return found

    def client_limits(self, identity: ClientIdentity) -> tuple[Limit, ...]:
        """The limits of the client alone: its tenant's, then its key's."""
        tenant = self.tenants.get(identity.tenant)
        found: tuple[Limit, ...] = () if tenant is None else tenant.limits
        return found + self.key_limits.get(identity.key, ())

    def class_rank(self, name: str) -> int | None:
        """0 for the top class; None for an undeclared one."""
        try:
            return self.classes.index(name)
        except ValueError:
            return None


def _limits(scope: str, name: str, rate_limits: RateLimits | None) -> tuple[Limit, ...]:
    if rate_limits is None:
        return ()
    return tuple(
        Limit(scope, name, item.kind, item.limit, item.window_ms / 1000)
        for item in rate_limits.limits()
    )


def admission_policy(gateway: Gateway) -> AdmissionPolicy:
    """The admission stage's view of a resolved config (sluicegate.model): its tenants,
    limits and gates turned into the limiter's and the gates' own types."""
    admission = gateway.admission
    class_policies = tuple(
        ClassPolicy(
            name=item.name,
            max_queue=item.queue_room,
            max_wait_s=item.max_wait / 1000 if item.max_wait > 0 else _NO_WAIT_S,
        )
        for item in admission.priority_classes
    )
    replicas = admission.ext_proc_processes

    def gate_policy(concurrency: Concurrency) -> GatePolicy:
        # A gate's capacities are the route's (or provider's) totals: each replica takes
        # its share, as the limiter's local fallback does; Envoy spreads requests over the
        # replicas round robin.
        return GatePolicy(
            classes=class_policies,
            max_requests=replica_share(concurrency.max_requests, replicas),
            max_tokens=replica_share(concurrency.max_tokens, replicas),
            headroom=concurrency.headroom,
            max_queued=admission.max_queued,
        )

    gates: dict[str, GatePolicy] = {}
    routes: dict[str, RoutePolicy] = {}
    for route in gateway.routes:
        for gate in route.gates:
            gates.setdefault(gate.name, gate_policy(gate.concurrency))
        only = route.sole_provider
        routes[route.name] = RoutePolicy(
            name=route.name,
            default_max_tokens=route.default_max_tokens,
            gates=tuple(gate.name for gate in route.gates),
            model_limits={
                model: limits
                for model in route.models
                if (limits := _limits(SCOPE_MODEL, model, route.rate_limits))
            },
            provider_limits=()
            if only is None
            else _limits(SCOPE_PROVIDER, only.name, only.rate_limits),
            scenario=route.scenario,
            asks_stream_usage=route.asks_stream_usage,
        )
    # A provider's gate exists even when no route sends to it alone (it then gates nothing).
    for provider in gateway.providers:
        if provider.concurrency is not None:
            name = gate_name("provider", provider.name)
            gates.setdefault(name, gate_policy(provider.concurrency))
    tenants = gateway.tenants
    store = admission.store
    return AdmissionPolicy(
        keyring=KeyRing((t.name, key.name, key.hash) for t in tenants for key in t.keys)
        if tenants
        else None,
        tenants={
            t.name: TenantPolicy(
                name=t.name,
                priority=t.priority,
                allowed_models=t.models,
                limits=_limits(SCOPE_TENANT, t.name, t.rate_limits),
                auto=t.auto,
            )
            for t in tenants
        },
        key_limits={
            key.name: _limits(SCOPE_KEY, key.name, key.rate_limits)
            for t in tenants
            for key in t.keys
            if key.rate_limits is not None
        },
        classes=admission.class_names,
        default_priority=admission.default_priority,
        routes=routes,
        gates=gates,
        default_max_tokens=admission.default_max_tokens,
        max_output_tokens=admission.max_output_tokens,
        counts_tokens=admission.counts_tokens,
        keys_checked_by_envoy=admission.keys_checked_by_envoy,
        scenarios=frozenset(gateway.scenarios),
        store=StoreSettings(
            kind=store.kind,
            url=store.url,
            key_prefix=store.key_prefix,
            timeout_s=store.timeout / 1000,
            on_failure=store.on_failure,
            replicas=replicas,
        ),
    )


def replica_share(total: int | None, replicas: int) -> int | None:
    """One replica's share of a capacity: total ÷ replicas, at least 1 (so with fewer
    slots than replicas the replicas together allow more; `validate` warns)."""
    return None if total is None else max(1, total // replicas)
