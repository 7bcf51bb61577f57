"""Routes and their backends, and the one rule for which route serves a request.

Match order (Envoy's RouteConfiguration and the ext_proc routing stage both follow it,
docs/architecture.md "A request's path"): routes in config order, each route's models as
configured; for a model and a request path the first route whose path prefix the path
starts with wins. `match_order` and `first_match` are the only places that say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Final, Protocol, TypeVar

from sluicegate import config

from .providers import HealthCheck, Provider

CLUSTER_PREFIX: Final = "route-"

# How a route's providers share traffic within a priority level (config `routing:`):
# the configured weights, or weights learned from latency and errors (sluicegate.latency).
Routing = config.Routing
LATENCY: Final = config.ROUTING_LATENCY


def gate_name(kind: str, name: str) -> str:
    """`route:chat`, `provider:local`: one namespace for both kinds of gate."""
    return f"{kind}:{name}"


@dataclass(frozen=True, slots=True)
class Backend:
    provider: Provider
    weight: int
    priority: int  # dense rank within the route: 0, 1, 2 … (config may skip numbers)


@dataclass(frozen=True, slots=True)
class Gate:
    """A priority gate a request takes: `route:<name>` or `provider:<name>`."""

    name: str
    concurrency: config.Concurrency


@dataclass(frozen=True, slots=True)
class EnvoyGate:
    """A route's gate as Envoy enforces it, when only fast-lane requests reach it
    (config.Admission.gate_is_envoys): the route cluster's circuit breakers at two of
    Envoy's routing priorities, each its own partition of the gate
    (docs/fast-lane.md, "Gates in the fast lane"). `top_class`'s requests take Envoy's
    HIGH priority and the headroom's share; every other request DEFAULT and the rest.
    With one partition (`top_class` None) every request is DEFAULT and holds the whole
    gate. The figures are the limits Envoy is given, the pool's already applied."""

    requests: int  # DEFAULT's in flight
    pending: int  # DEFAULT's waiting at most (Envoy's max_pending_requests)
    top_class: str | None = None
    top_requests: int = 0  # HIGH's in flight
    top_pending: int = 0  # HIGH's waiting at most

    def describe(self) -> str:
        """The partitions, for `sluicegate validate`."""
        if self.top_class is None:
            return f"{self.requests} in flight, up to {self.pending} waiting"
        return (
            f"class {self.top_class}: {self.top_requests} in flight, up to "
            f"{self.top_pending} waiting; the other classes: {self.requests} in flight, up "
            f"to {self.pending} waiting"
        )


def resolve_envoy_gate(
    route: config.Route,
    pool: config.Pool,
    protocol: config.Protocol,
    admission: config.Admission,
    tenants: Sequence[config.Tenant],
) -> EnvoyGate | None:
    """The route's gate in Envoy, or None: no gate, or one the routing stage enforces.

    The gate is first bounded by the route's pool (`pool` covers the whole route; on
    HTTP/1.1 a request holds a connection, so the connection limits bound it too, the
    per-provider one counted once per provider, as Envoy counts a host's connections
    across priorities), then split: two partitions only when the tenants allowed its
    models include one of the top class and one of a lower class (else a HIGH share
    alone, or a DEFAULT share alone, would sit idle). A partition's pending limit is its
    classes' queues plus its share in flight: Envoy counts a request waiting for its
    connection to open as pending, so on cold connections (none yet, or closed after
    `idle_timeout`) a burst is all pending at first, and the queues alone would refuse
    it under the gate. The pool's pending limit is split as the gate is, by the shares
    in flight (one partition when it is too small to split)."""
    gate = route.concurrency
    if gate is None or gate.max_requests is None:
        return None
    if not admission.gate_is_envoys(tenants, route.models):
        return None
    classes = admission.priority_classes
    total = min(gate.max_requests, pool.max_requests)
    if protocol == "http1":
        total = min(total, pool.max_connections)
        if pool.max_connections_per_provider:
            providers = len({backend.provider for backend in route.backends})
            total = min(total, pool.max_connections_per_provider * providers)
    room = pool.max_pending_requests

    def queued(items: Sequence[config.PriorityClass]) -> int:
        waiting = sum(item.queue_room for item in items)
        return waiting if admission.max_queued is None else min(waiting, admission.max_queued)

    lower = config.lower_class_share(total, gate.headroom)
    top = classes[0].name
    defaults = {admission.priority_of(t) for t in admission.tenants_of(tenants, route.models)}
    if lower >= total or room < 2 or top not in defaults or not defaults - {top}:
        return EnvoyGate(requests=total, pending=min(queued(classes) + total, room))
    top_requests = total - lower
    top_room = max(1, room * top_requests // total)
    return EnvoyGate(
        requests=lower,
        pending=min(queued(classes[1:]) + lower, max(1, room - top_room)),
        top_class=top,
        top_requests=top_requests,
        top_pending=min(queued(classes[:1]) + top_requests, top_room),
    )


@dataclass(frozen=True, slots=True)
class Route:
    """Requests for `models` under `path_prefix`, served by one cluster of providers."""

    name: str
    models: tuple[str, ...]
    # Always ends with "/": the prefix is a directory, so "/openai" does not match
    # "/openaiX" and the rewrite to a provider's prefix can keep the slash.
    path_prefix: str
    backends: tuple[Backend, ...]  # sorted by (priority, provider name)
    # Pools, timeouts, retries, outlier detection: `defaults` merged with the route's own.
    settings: config.Resilience = field(default_factory=config.Resilience)
    fault: config.Fault | None = None  # a failover drill (Envoy's fault filter), usually None
    # Admission: per-model rate limits, the output estimate (the route's or admission's
    # default) and the route's own gate.
    rate_limits: config.RateLimits | None = None
    default_max_tokens: int = 1024
    concurrency: config.Concurrency | None = None
    # The gate as Envoy enforces it, when only the fast lane reaches it; the routing stage
    # then takes it for no request (`gates`).
    envoy_gate: EnvoyGate | None = None
    # The route's provider when the config gives it one only. Drains do not change it:
    # a provider's gate and limits follow the file, the same in every ext_proc replica.
    sole_provider: Provider | None = None
    # What its requests are reported as unless a client picks another declared scenario
    # (config.DEFAULT_SCENARIO when the route names none).
    scenario: str = config.DEFAULT_SCENARIO
    # Backend weights as configured (`static`), or as the control plane learns them
    # (`latency`: Gateway.with_weights sets the learned ones; docs/latency-routing.md).
    routing: Routing = "static"

    @property
    def cluster_name(self) -> str:
        return f"{CLUSTER_PREFIX}{self.name}"

    @property
    def uses_eds(self) -> bool:
        """EDS when every host is an IP literal; otherwise Envoy resolves names (DNS)."""
        return all(backend.provider.is_ip for backend in self.backends)

    @property
    def gates(self) -> tuple[Gate, ...]:
        """The gates a request takes, in this order: the route's, then its sole provider's
        (a provider's gate is taken before Envoy picks among a route's providers, so it
        covers only the routes that send to that provider alone)."""
        gates = []
        if self.concurrency is not None and self.envoy_gate is None:
            gates.append(Gate(gate_name("route", self.name), self.concurrency))
        only = self.sole_provider
        if only is not None and only.concurrency is not None:
            gates.append(Gate(gate_name("provider", only.name), only.concurrency))
        return tuple(gates)

    @property
    def held_in_exact_lane(self) -> str | None:
        """Why its requests need the routing stage, or None: a gate (its own or its sole
        provider's), per-model limits, or its sole provider's limits, which the fast lane
        cannot enforce. An `auto` tenant's requests for its models take the exact lane
        whatever the tenant's lane (docs/fast-lane.md, "Models held in the exact lane")."""
        only = self.sole_provider
        if self.concurrency is not None and self.envoy_gate is None:
            return f"route {self.name}'s concurrency gate"
        if only is not None and only.concurrency is not None:
            return f"provider {only.name}'s concurrency gate"
        if self.rate_limits is not None:
            return f"route {self.name}'s rate limits"
        if only is not None and only.rate_limits is not None:
            return f"provider {only.name}'s rate limits"
        return None

    @property
    def asks_stream_usage(self) -> bool:
        """A stream's usage event may be asked for: every provider takes the option (the
        request is written before Envoy picks one, and a retry may go to another)."""
        return all(backend.provider.ask_stream_usage for backend in self.backends)

    @property
    def shared_upstream_prefix(self) -> str | None:
        """The providers' common URL path prefix, or None when they differ."""
        prefixes = {backend.provider.path_prefix for backend in self.backends}
        return prefixes.pop() if len(prefixes) == 1 else None

    @property
    def prefix_rewrite(self) -> str | None:
        """What the route rewrites `path_prefix` to, or None for no route-level rewrite.

        Only possible when all providers share a prefix: the route is chosen before the
        host, so a per-provider prefix must be applied per attempt (upstream ext_proc).
        """
        shared = self.shared_upstream_prefix
        if shared is None:
            return None
        target = f"{shared}/"
        return None if target == self.path_prefix else target

    @property
    def renames_models(self) -> bool:
        """Some provider knows one of this route's models by another name."""
        return any(
            backend.provider.upstream_model(model) != model
            for backend in self.backends
            for model in self.models
        )

    @property
    def needs_attempt_processing(self) -> bool:
        """Per-provider rewriting that only the attempt-stage ext_proc can do."""
        return self.renames_models or self.shared_upstream_prefix is None

    @property
    def protocol(self) -> config.Protocol:
        """The one upstream protocol of the route's providers (validated to agree)."""
        return self.backends[0].provider.protocol

    @property
    def learns_weights(self) -> bool:
        return self.routing == LATENCY

    def with_weights(self, weights: Mapping[str, int]) -> Route:
        """This route with `weights` (provider -> weight) for the providers they name;
        the others keep theirs. Only what Envoy's endpoints carry changes."""
        if all(weights.get(b.provider.name, b.weight) == b.weight for b in self.backends):
            return self
        backends = tuple(
            replace(b, weight=weights.get(b.provider.name, b.weight)) for b in self.backends
        )
        return replace(self, backends=backends)

    @property
    def priority_levels(self) -> int:
        return 1 + max(backend.priority for backend in self.backends)

    @property
    def first_level_size(self) -> int:
        """Providers at priority 0: how many a retry tries before moving down a level."""
        return sum(1 for backend in self.backends if backend.priority == 0)

    @property
    def health_check(self) -> HealthCheck | None:
        """The route's active health check: that of its health-checked providers (which
        validation makes agree), or None when no provider has one."""
        checks = [b.provider.health_check for b in self.backends if b.provider.health_check]
        return checks[0] if checks else None

    def model_map_for(self, provider: Provider) -> dict[str, str]:
        """The provider's renames restricted to this route's models (nothing else leaks)."""
        return {
            model: provider.upstream_model(model)
            for model in self.models
            if provider.upstream_model(model) != model
        }


class PrefixedRoute(Protocol):
    """What `first_match` needs of a route: its path prefix."""

    @property
    def path_prefix(self) -> str: ...


R = TypeVar("R", bound=PrefixedRoute)


def match_order(routes: Iterable[Route]) -> Iterator[tuple[Route, tuple[str, ...]]]:
    """The model routes in the order Envoy tries them, one route's block at a time: config
    route order, then that route's models as configured. The first that matches wins."""
    for route in routes:
        yield route, route.models


def first_match(candidates: Sequence[R], path: str | None) -> R | None:
    """Of a model's routes in match order, the one Envoy picks for `path`: the first whose
    prefix the path falls under. With no path, or none matching, the first route (the
    request then meets the prefix's 404 fallback in Envoy, but is still labelled)."""
    if not candidates:
        return None
    if path is not None:
        for candidate in candidates:
            if path.startswith(candidate.path_prefix):
                return candidate
    return candidates[0]


def resolve_route(
    route: config.Route,
    providers: Mapping[str, Provider],
    defaults: config.Resilience,
    admission: config.Admission,
    tenants: Sequence[config.Tenant],
    drained: AbstractSet[str] = frozenset(),
) -> tuple[Route, str | None]:
    """One configured route, its backends resolved (validation made every name known),
    and a warning when draining could not apply to it.

    Draining: a drained provider is dropped from every route that has another provider
    left, so Envoy moves new requests to the others while requests in flight finish. A
    route whose every provider is drained keeps them: draining must never leave a model
    with nowhere to go.
    """
    kept = [b for b in route.backends if b.provider not in drained]
    warning = None
    if not kept:
        warning = f"route '{route.name}': every provider is drained; it keeps serving from them"
        kept = list(route.backends)
    # Dense priorities: Envoy would otherwise create empty priority levels for the gaps.
    levels = sorted({backend.priority for backend in kept})
    ranks = {priority: rank for rank, priority in enumerate(levels)}
    backends = sorted(
        (Backend(providers[b.provider], weight=b.weight, priority=ranks[b.priority]) for b in kept),
        key=lambda b: (b.priority, b.provider.name),
    )
    configured = {backend.provider for backend in route.backends}
    settings = config.effective(defaults, route)
    resolved = Route(
        name=route.name,
        models=tuple(dict.fromkeys(route.models)),
        path_prefix=config.normalize_path_prefix(route.path_prefix),
        backends=tuple(backends),
        settings=settings,
        fault=route.fault,
        rate_limits=route.rate_limits,
        default_max_tokens=route.default_max_tokens or admission.default_max_tokens,
        concurrency=route.concurrency,
        envoy_gate=resolve_envoy_gate(
            route, settings.pool, providers[route.backends[0].provider].protocol, admission, tenants
        ),
        sole_provider=providers[configured.pop()] if len(configured) == 1 else None,
        scenario=route.scenario or config.DEFAULT_SCENARIO,
        routing=route.routing,
    )
    return resolved, warning
