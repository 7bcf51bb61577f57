"""Rules that span the document: names, references between sections, models, URLs,
tenants, client keys and admission settings.

Each rule takes the valid parts of a document and returns Problems located by key
path. Socket collisions live in `sockets.py`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Iterator
from urllib.parse import urlsplit

from .addresses import is_ip_address
from .admin_address import parse_admin_address
from .admission import (
    FAST_LANE_MAX_LIMIT,
    FAST_LANE_MIN_FILL_MS,
    LANE_AUTO,
    LANE_EXACT,
    LANE_FAST,
    Admission,
    RateLimits,
)
from .document import Document, KeyRef, SettingsRoute
from .durations import format_duration_ms
from .keyhash import parse_key_hash
from .lane_rules import fast_lane_cannot_enforce
from .problems import Problem, Severity
from .resilience import (
    HealthCheck,
    Resilience,
    effective,
    set_in,
)
from .schema import (
    ACCESS_LOG_STDOUT,
    DEFAULT_SCENARIO,
    ROUTING_LATENCY,
    Provider,
    Route,
    normalize_path_prefix,
)
from .sockets import check_sockets
from .source import KeyPath, Locator, format_key_path

Rule = Callable[[Document, Locator], Iterable[Problem]]

MOCK_HOSTS = ("127.0.0.1",)  # `up` binds mocks there; localhost may resolve to ::1


def check_document(doc: Document, at: Locator) -> list[Problem]:
    """Every cross-document problem in `doc`."""
    return [problem for rule in RULES for problem in rule(doc, at)]


def check_unique_names(doc: Document, at: Locator) -> Iterable[Problem]:
    for section, names in doc.names.items():
        kind = section.removesuffix("s")
        first: dict[str, int] = {}
        for index, name in names:
            if name in first:
                earlier = (section, first[name], "name")
                yield at.error(
                    (section, index, "name"),
                    f"duplicate {kind} name '{name}' (first at {_where(at, earlier)})",
                )
            else:
                first[name] = index


def check_backends(doc: Document, at: Locator) -> Iterable[Problem]:
    known = doc.provider_names
    seen: dict[tuple[int, str], int] = {}  # (route, provider) -> first backend index
    for ref in doc.backends:
        path = ("routes", ref.route, "backends", ref.backend, "provider")
        first = seen.setdefault((ref.route, ref.provider), ref.backend)
        if ref.provider not in known:
            yield at.error(path, _unknown_provider(ref.provider, known))
        elif first != ref.backend:
            earlier = ("routes", ref.route, "backends", first, "provider")
            yield at.error(
                path,
                f"provider '{ref.provider}' is already a backend of route '{ref.route_name}' "
                f"(at {_where(at, earlier)}); give it one entry with the combined weight",
            )


def check_models(doc: Document, at: Locator) -> Iterable[Problem]:
    owner: dict[tuple[str, str], tuple[int, int]] = {}  # (path_prefix, model) -> (route, index)
    for r, route in doc.routes:
        listed: set[str] = set()
        for m, model in enumerate(route.models):
            path = ("routes", r, "models", m)
            if model in listed:
                yield at.warning(path, f"model '{model}' is listed twice in route '{route.name}'")
                continue
            listed.add(model)
            key = (normalize_path_prefix(route.path_prefix), model)
            if key in owner:
                other_r, other_m = owner[key]
                other = dict(doc.routes)[other_r]
                first = _where(at, ("routes", other_r, "models", other_m))
                yield at.error(
                    path,
                    f"model '{model}' under path_prefix '{route.path_prefix}' is already served "
                    f"by route '{other.name}' (at {first})",
                )
            else:
                owner[key] = (r, m)


def check_provider_use(doc: Document, at: Locator) -> Iterable[Problem]:
    """Providers no route uses, model_map entries no route needs, models a mock lacks."""
    if not doc.complete:
        return  # a route that failed validation may be the one that uses them
    routed: dict[str, set[str]] = {}  # provider -> models that routes send to it
    for _, route in doc.routes:
        for backend in route.backends:
            routed.setdefault(backend.provider, set()).update(route.models)
    for p, provider in doc.providers:
        models = routed.get(provider.name)
        if models is None:
            if doc.routes:
                yield at.warning(
                    ("providers", p, "name"),
                    f"no route sends traffic to provider '{provider.name}'",
                )
            continue
        for client_model in provider.model_map:
            if client_model not in models:
                yield at.warning(
                    ("providers", p, "model_map", client_model),
                    f"no route sends model '{client_model}' to provider '{provider.name}', "
                    "so this mapping is never used",
                )
        if provider.mock is not None and provider.mock.models:
            served = provider.mock.models
            for client_model in sorted(models):
                upstream = provider.model_map.get(client_model, client_model)
                if upstream not in served:
                    shown = f"'{client_model}'" + (
                        f" (as '{upstream}')" if upstream != client_model else ""
                    )
                    yield at.warning(
                        ("providers", p, "mock", "models"),
                        f"routes send model {shown} to mock provider '{provider.name}', "
                        f"which serves only: {', '.join(served)}",
                    )


def check_provider_gates(doc: Document, at: Locator) -> Iterable[Problem]:
    """A provider's concurrency gate and rate limits are applied before Envoy picks a
    provider, so they cover only routes whose every backend is that provider; say so for
    the others."""
    for field in ("concurrency", "rate_limits"):
        marked = {p.name: i for i, p in doc.providers if getattr(p, field) is not None}
        for r, route in doc.routes:
            names = {backend.provider for backend in route.backends}
            if len(names) < 2:
                continue
            for name in sorted(names & marked.keys()):
                yield at.warning(
                    ("providers", marked[name], field),
                    f"route '{route.name}' sends to '{name}' and other providers, so this "
                    f"{field} does not cover it (use the route's own); at routes[{r}]",
                )


def check_gate_shares(doc: Document, at: Locator) -> Iterable[Problem]:
    """Each ext_proc replica enforces its share of a gate, total ÷ replicas (at least 1):
    warn where the shares cannot add up to the total."""
    replicas = doc.ext_proc_processes()
    if replicas == 1:
        return
    gates = [("providers", i, p.concurrency) for i, p in doc.providers]
    # A gate Envoy enforces is not split between ext_proc replicas.
    admission = doc.admission or Admission()
    tenants = [tenant for _, tenant in doc.tenants]
    gates += [
        ("routes", i, r.concurrency)
        for i, r in doc.routes
        if not admission.gate_is_envoys(tenants, r.models)
    ]
    for section, index, concurrency in gates:
        if concurrency is None:
            continue
        for field in ("max_requests", "max_tokens"):
            total = getattr(concurrency, field)
            if total is None or total % replicas == 0:
                continue
            share = max(1, total // replicas)
            yield at.warning(
                (section, index, "concurrency", field),
                f"{replicas} ext_proc replicas each allow {share} ({total} ÷ {replicas}"
                f"{', at least 1' if total < replicas else ', rounded down'}): "
                f"{share * replicas} in all; use a multiple of {replicas}",
            )


def check_unshared_limits(doc: Document, at: Locator) -> Iterable[Problem]:
    """The memory store counts in one process: with several ext_proc replicas each counts
    alone, so together they admit up to replicas times every limit (LiteLLM's trap)."""
    admission = doc.admission
    if admission is None or admission.store.kind != "memory":
        return
    replicas = doc.ext_proc_processes()
    if replicas == 1:
        return
    limited = [tenant.rate_limits for _, tenant in doc.tenants]
    limited += [key.rate_limits for _, tenant in doc.tenants for key in tenant.keys]
    limited += [route.rate_limits for _, route in doc.routes]
    limited += [provider.rate_limits for _, provider in doc.providers]
    if all(limits is None for limits in limited):
        return
    path: tuple[str | int, ...] = (
        ("sluicegate", "ext_proc_replicas")
        if doc.replica_addresses
        else ("admission", "store", "replicas")
    )
    yield at.warning(
        path,
        f"{replicas} ext_proc processes share no rate-limit counts with the memory store: "
        f"each counts alone, so together they admit up to {replicas}x every limit, and "
        "a reservation is reconciled only where the response's usage report lands; "
        "set admission.store.kind: redis to share them",
    )


def check_tls(doc: Document, at: Locator) -> Iterable[Problem]:
    for p, provider in doc.providers:
        if provider.tls is not None and urlsplit(provider.base_url).scheme != "https":
            yield at.error(
                ("providers", p, "tls"),
                "tls settings need an https:// base_url; this provider is reached over http://",
            )


def check_mock_urls(doc: Document, at: Locator) -> Iterable[Problem]:
    """`sluicegate up` starts mock providers itself, so their URL must be a local socket."""
    for p, provider in doc.providers:
        if provider.mock is None:
            continue
        path = ("providers", p, "base_url")
        parts = urlsplit(provider.base_url)
        if parts.scheme != "http":
            yield at.error(path, "a mock provider is served over plain http://, not https://")
        if parts.hostname not in MOCK_HOSTS:
            yield at.error(
                path,
                f"a mock provider runs on this machine: use host {' or '.join(MOCK_HOSTS)}, "
                f"not '{parts.hostname}'",
            )
        if parts.port is None:
            yield at.error(
                path,
                "a mock provider needs an explicit port, e.g. http://127.0.0.1:8101",
            )


_PROTOCOL_NAMES = {"http1": "HTTP/1.1", "http2": "HTTP/2"}


def _route_providers(doc: Document, route: Route) -> list[tuple[int, int, Provider]]:
    """(backend index, provider index, provider) for the route's valid, known providers."""
    by_name = {provider.name: (p, provider) for p, provider in doc.providers}
    return [
        (b, *by_name[backend.provider])
        for b, backend in enumerate(route.backends)
        if backend.provider in by_name
    ]


def check_protocols(doc: Document, at: Locator) -> Iterable[Problem]:
    """Envoy sets the upstream protocol per cluster, and a route is one cluster."""
    for r, route in doc.routes:
        providers = _route_providers(doc, route)
        if not providers:
            continue
        _, first_p, first = providers[0]
        for b, _, provider in providers[1:]:
            if provider.protocol != first.protocol:
                yield at.error(
                    ("routes", r, "backends", b, "provider"),
                    f"route '{route.name}' mixes {_PROTOCOL_NAMES[provider.protocol]} "
                    f"provider '{provider.name}' with {_PROTOCOL_NAMES[first.protocol]} "
                    f"provider '{first.name}' "
                    f"(at {_where(at, ('providers', first_p))}); Envoy "
                    "speaks one protocol per route: give them the same protocol or serve "
                    "them in separate routes",
                )


def check_routing(doc: Document, at: Locator) -> Iterable[Problem]:
    """`routing: latency` moves a route's provider weights over EDS, which only a route
    whose providers are all IP literals has (a DNS cluster carries its endpoints inside
    the cluster, so every weight change would replace the cluster); and it needs two
    providers in one priority level to weigh (docs/latency-routing.md)."""
    for r, route in doc.routes:
        if route.routing != ROUTING_LATENCY:
            continue
        providers = _route_providers(doc, route)
        for _, p, provider in providers:
            host = urlsplit(provider.base_url).hostname or ""
            if not is_ip_address(host):
                yield at.error(
                    ("routes", r, "routing"),
                    f"route '{route.name}': routing: latency needs every provider reached by "
                    f"IP address, and provider '{provider.name}' has host '{host}' (at "
                    f"{_where(at, ('providers', p, 'base_url'))}); the control plane does no "
                    "DNS, and weights of a route Envoy resolves itself could only change by "
                    "replacing its cluster: use static routing, or an IP address",
                )
                break
        levels: dict[int, int] = {}
        for backend in route.backends:
            levels[backend.priority] = levels.get(backend.priority, 0) + 1
        if len(providers) == len(route.backends) and max(levels.values()) < 2:
            yield at.warning(
                ("routes", r, "routing"),
                f"route '{route.name}': routing: latency has nothing to weigh: no priority "
                "level of this route has two providers, so its weights stay as configured",
            )


def health_check_key(provider: Provider, check: HealthCheck) -> tuple[object, ...]:
    """What one route's health-checked providers must share (Envoy: one check per cluster)."""
    return (
        provider.health_check_path,
        check.interval,
        check.timeout,
        check.unhealthy_threshold,
        check.healthy_threshold,
        tuple(check.status_ranges()),
    )


def check_health_checks(doc: Document, at: Locator) -> Iterable[Problem]:
    for r, route in doc.routes:
        first: tuple[Provider, int, tuple[object, ...]] | None = None
        for b, p, provider in _route_providers(doc, route):
            if provider.health_check is None:
                continue
            key = health_check_key(provider, provider.health_check)
            if first is None:
                first = (provider, p, key)
            elif key != first[2]:
                other, other_p, other_key = first
                detail = (
                    f"path {key[0]} vs {other_key[0]}" if key[0] != other_key[0] else "settings"
                )
                yield at.error(
                    ("routes", r, "backends", b, "provider"),
                    f"providers '{provider.name}' and '{other.name}' of route '{route.name}' "
                    f"have different health checks ({detail}; '{other.name}' at "
                    f"{_where(at, ('providers', other_p, 'health_check'))}); Envoy runs one "
                    "health check per route: give them the same health_check settings "
                    "(e.g. an explicit path) or serve them in separate routes",
                )


Finding = tuple[Severity, tuple[tuple[str, ...], ...], str]


def _listed(timers: list[tuple[str, int]]) -> str:
    """`first_byte (30s) and first_token (15s)`."""
    return " and ".join(f"{name} ({format_duration_ms(value)})" for name, value in timers)


def _setting_findings(settings: Resilience) -> Iterator[Finding]:
    """Rules on one set of settings: (severity, the fields involved, message)."""
    timeouts = settings.timeouts
    first_byte, idle, total = timeouts.first_byte, timeouts.idle, timeouts.total
    backoff = settings.retries.backoff
    if backoff.base > backoff.max:
        yield (
            "error",
            (("retries", "backoff", "base"), ("retries", "backoff", "max")),
            f"backoff base ({format_duration_ms(backoff.base)}) is longer than backoff max "
            f"({format_duration_ms(backoff.max)})",
        )
    outlier = settings.outlier_detection
    if outlier.base_ejection_time > outlier.max_ejection_time:
        yield (
            "error",
            (
                ("outlier_detection", "base_ejection_time"),
                ("outlier_detection", "max_ejection_time"),
            ),
            f"base_ejection_time ({format_duration_ms(outlier.base_ejection_time)}) is longer "
            f"than max_ejection_time ({format_duration_ms(outlier.max_ejection_time)})",
        )
    # The per-attempt timers that end at the response headers: non-streamed, and streamed
    # where written (unset, it is never longer than first_byte, which is checked).
    written = () if timeouts.first_token is None else (("first_token", timeouts.first_token),)
    header_timers = [
        (name, value) for name, value in (("first_byte", first_byte), *written) if value
    ]
    cut_by_idle = [(name, value) for name, value in header_timers if idle and idle < value]
    if cut_by_idle:
        yield (
            "warning",
            (("timeouts", "idle"), *(("timeouts", name) for name, _ in cut_by_idle)),
            f"idle ({format_duration_ms(idle)}) is shorter than {_listed(cut_by_idle)}: the "
            "idle timer also runs while waiting for the first byte, so it fires first and "
            f"{'it never does' if len(cut_by_idle) == 1 else 'they never do'}",
        )
    too_long = [(name, value) for name, value in header_timers if total and value >= total]
    if too_long:
        yield (
            "warning",
            (*(("timeouts", name) for name, _ in too_long), ("timeouts", "total")),
            f"{_listed(too_long)} {'is' if len(too_long) == 1 else 'are'} not shorter than "
            f"total ({format_duration_ms(total)}), so a slow attempt is never retried",
        )
    if total and idle and idle >= total:
        yield (
            "warning",
            (("timeouts", "idle"), ("timeouts", "total")),
            f"idle ({format_duration_ms(idle)}) is not shorter than total "
            f"({format_duration_ms(total)}), so it never fires",
        )


def check_resilience(doc: Document, at: Locator) -> Iterable[Problem]:
    """Rules on the `defaults:` section, then on each route's effective settings.

    A problem found in `defaults` is reported there once; a route reports only problems
    that involve a field the route itself sets. A rule on a field that failed validation
    stays quiet (its error is reported already; the default standing in for it is not
    what the user wrote), so every other problem still shows in the same run.
    """
    defaults = doc.defaults
    if defaults is None:
        return
    for severity, fields, message in _setting_findings(defaults):
        if _involves(fields, doc.defaults_dropped):
            continue
        origin = next((f for f in fields if set_in(defaults, None, f) == "defaults"), fields[0])
        yield at.problem(("defaults", *origin), message, severity)
    for item in doc.settings_routes:
        r, route = item.index, item.route
        settings = effective(defaults, route)
        for severity, fields, message in _setting_findings(settings):
            if _involves(fields, doc.defaults_dropped | item.dropped):
                continue
            mine = [f for f in fields if set_in(defaults, route, f) == "route"]
            if mine:
                path: KeyPath = ("routes", r, *mine[0])
                yield at.problem(path, f"route '{route.name}': {message}", severity)
        yield from _ejection_problems(doc, at, item, settings)


def _involves(fields: Iterable[tuple[str, ...]], dropped: Iterable[KeyPath]) -> bool:
    """Whether any of `fields` is, or is inside, a key that failed validation."""
    dropped = tuple(dropped)
    return any(field[: len(path)] == path for field in fields for path in dropped)


def _ejection_problems(
    doc: Document, at: Locator, item: SettingsRoute, settings: Resilience
) -> Iterator[Problem]:
    r, route = item.index, item.route
    outlier = settings.outlier_detection
    count = len(_route_providers(doc, route))
    if not outlier.enabled or count < 2:
        return
    field_path = ("outlier_detection", "max_ejection_percent")
    fields = (field_path, ("outlier_detection", "enabled"))
    if _involves(fields, doc.defaults_dropped | item.dropped):
        return
    # Envoy ejects only while (ejected + 1) / hosts stays within max_ejection_percent.
    if 100 / count > outlier.max_ejection_percent:
        origin = set_in(doc.defaults, route, field_path)
        path: KeyPath = (
            ("routes", r, *field_path)
            if origin == "route"
            else ("defaults", *field_path)
            if origin == "defaults"
            else ("routes", r, "name")
        )
        yield at.warning(
            path,
            f"route '{route.name}' has {count} providers, so max_ejection_percent "
            f"{outlier.max_ejection_percent} lets Envoy eject none of them; use at least "
            f"{-(-100 // count)}",
        )


def check_admission(doc: Document, at: Locator) -> Iterable[Problem]:
    """Priority classes, token estimates and the limiter store of `admission:`."""
    admission = doc.admission
    if admission is None:
        return
    first: dict[str, int] = {}
    for c, item in enumerate(admission.priority_classes):
        if item.name in first:
            earlier = ("admission", "priority_classes", first[item.name], "name")
            yield at.error(
                ("admission", "priority_classes", c, "name"),
                f"duplicate priority class name '{item.name}' (first at {_where(at, earlier)})",
            )
        else:
            first[item.name] = c
    if admission.default_priority not in first:
        message = _unknown("priority class", admission.default_priority, tuple(first))
        if "default_priority" not in admission.model_fields_set:
            message += "; set admission.default_priority to one of the declared classes"
        yield at.error(("admission", "default_priority"), message)
    yield from _token_estimates(doc, at, admission)
    store = admission.store
    if store.kind == "redis" and store.url is None:
        yield at.error(
            ("admission", "store", "kind"),
            "a redis store needs a url, e.g. url: redis://127.0.0.1:6379/0",
        )
    if store.kind == "memory" and store.url is not None:
        yield at.error(
            ("admission", "store", "url"),
            "url is used only by a redis store: set kind: redis or remove the url",
        )


def uses_fast_lane(doc: Document) -> bool:
    """Whether Envoy may decide any request alone: `admission.lane: fast` or `auto`, or a
    tenant's."""
    admission = doc.admission
    return (admission is not None and admission.gateway_lane != LANE_EXACT) or any(
        tenant.lane not in (None, LANE_EXACT) for _, tenant in doc.tenants
    )


def check_auto_lane(doc: Document, at: Locator) -> Iterable[Problem]:
    """Warn where the auto lane would do nothing: `admission.auto_lane` set with no `auto`
    tenant, and an `auto` tenant with no limit (nothing to move it by: it stays fast)."""
    admission = doc.admission
    if admission is None:
        return
    auto = [(t, tenant) for t, tenant in doc.tenants if admission.lane_of(tenant) == LANE_AUTO]
    if "auto_lane" in admission.model_fields_set and not auto:
        yield at.warning(
            ("admission", "auto_lane"),
            "no tenant takes lane auto, so these thresholds move nobody",
        )
    for t, tenant in auto:
        for path, limits in [
            (("tenants", t, "rate_limits"), tenant.rate_limits),
            *((("tenants", t, "keys", k, "rate_limits"), key.rate_limits)
              for k, key in enumerate(tenant.keys)),
        ]:  # fmt: skip
            for limit in limits.limits() if limits is not None else ():
                bucket = admission.auto_lane.bucket_size(limit.limit)
                if admission.bucket_refuses_uncapped(limit):
                    yield at.warning(
                        (*path, limit.kind),
                        f"in the fast lane this limit is a bucket of {bucket:,} tokens, less "
                        f"than admission.default_max_tokens ({admission.default_max_tokens:,}):"
                        " every request without an output cap is refused there and moves "
                        "the tenant to the exact lane",
                    )
        if (
            admission.lane_written(tenant)
            and tenant.rate_limits is None
            and all(key.rate_limits is None for key in tenant.keys)
        ):
            yield at.warning(
                ("tenants", t, "lane") if tenant.lane else ("tenants", t),
                f"tenant '{tenant.name}' takes lane auto but has no rate limit, its own or "
                "a key's: it stays in the fast lane",
            )


def check_lane(doc: Document, at: Locator) -> Iterable[Problem]:
    """The fast lane is decided by Envoy alone (docs/fast-lane.md): it checks client keys
    itself, every key of every tenant (so each needs its `secret`), and it limits
    fast-lane (and `auto`) tenants and keys, and routes' models, with token buckets
    (whole-second refills, uint32 sizes). It cannot enforce providers' limits nor
    providers' concurrency gates, which a `fast` tenant's requests (or, without tenants,
    every request) would pass unchecked, nor routes' limits beside exact-lane or `auto`
    tenants (each lane would count a model apart). An `auto` tenant's requests for a model
    under those take the routing stage (model.Route.held_in_exact_lane). Routes' gates:
    check_fast_lane_gates."""
    if doc.admission is None or not uses_fast_lane(doc):
        return
    where: KeyPath = (
        ("admission", "lane")
        if doc.admission.gateway_lane != LANE_EXACT
        else next(
            ("tenants", t, "lane")
            for t, tenant in doc.tenants
            if tenant.lane not in (None, LANE_EXACT)
        )
    )
    lane = (
        doc.admission.gateway_lane
        if where[0] == "admission"
        else next(tenant.lane for t, tenant in doc.tenants if t == where[1])
    )
    # Where Envoy decides requests whatever their model: a `fast` tenant, or no tenants.
    unheld: KeyPath | None = ("admission", "lane") if not doc.tenants else None
    for t, tenant in doc.tenants:
        if unheld is None and doc.admission.lane_of(tenant) == LANE_FAST:
            unheld = ("tenants", t, "lane") if tenant.lane else ("admission", "lane")
    found = []
    if unheld is not None:
        # An `auto` tenant is in the exact lane whenever it nears its limits.
        exact = any(doc.admission.lane_of(tenant) != LANE_FAST for _, tenant in doc.tenants)
        found = fast_lane_cannot_enforce(
            (provider for _, provider in doc.providers), (route for _, route in doc.routes), exact
        )
    if unheld is not None and found:
        # Without tenants there is nobody to move, so `auto` is the fast lane too.
        named, instead = (LANE_FAST, "auto or exact") if doc.tenants else (lane, "exact")
        yield at.error(
            unheld,
            f"lane {named} cannot enforce {' or '.join(found)}, which this config has: "
            f"use lane: {instead} (docs/fast-lane.md)",
        )
    scopes: list[tuple[KeyPath, RateLimits | None]] = [
        (("routes", r, "rate_limits"), route.rate_limits) for r, route in doc.routes
    ]
    for t, tenant in doc.tenants:
        if doc.admission.lane_of(tenant) == LANE_EXACT:
            continue
        scopes += [(("tenants", t, "rate_limits"), tenant.rate_limits)]
        scopes += [
            (("tenants", t, "keys", k, "rate_limits"), key.rate_limits)
            for k, key in enumerate(tenant.keys)
        ]
    for path, limits in scopes:
        if limits is not None and limits.per < FAST_LANE_MIN_FILL_MS:
            yield at.error(
                (*path, "per"),
                f"lane {lane} refills Envoy's token buckets at most once a second (Envoy "
                f"refuses a bucket refilled more often than every 50 ms): `per` must be "
                f"at least 1s, got {format_duration_ms(limits.per)}",
            )
        for limit in limits.limits() if limits is not None else ():
            if limit.limit > FAST_LANE_MAX_LIMIT:
                yield at.error(
                    (*path, limit.kind),
                    f"lane {lane} keeps limits in Envoy's token buckets, which hold at most "
                    f"{FAST_LANE_MAX_LIMIT:,}; got {limit.limit:,}",
                )
    for ref in doc.client_keys:
        if ref.key.secret is None:
            yield at.error(
                ("tenants", ref.tenant, "keys", ref.index),
                f"client key '{ref.key.name}' has no secret: with lane {lane} Envoy checks "
                "every key itself, so it needs the key from `secret: {env: NAME}` or "
                '`secret: {file: path}` (docs/fast-lane.md, "Keys")',
            )


def _gate_lanes(doc: Document, route: Route) -> frozenset[str]:
    admission = doc.admission or Admission()
    return admission.lanes_at_gate([tenant for _, tenant in doc.tenants], route.models)


def check_fast_lane_gates(doc: Document, at: Locator) -> Iterable[Problem]:
    """A route's gate is enforced in one place (config.Admission.lanes_at_gate): by Envoy
    when only fast-lane requests reach it, counting requests in flight (its circuit
    breakers count no tokens), else by the routing stage, which no `fast` tenant's request
    passes (docs/fast-lane.md, "Gates in the fast lane")."""
    for r, route in doc.routes:
        gate = route.concurrency
        lanes = _gate_lanes(doc, route)
        if gate is None or LANE_FAST not in lanes:
            continue
        if LANE_EXACT in lanes:
            yield at.error(
                ("routes", r, "concurrency"),
                f"route '{route.name}'s gate is reached by fast-lane requests and by "
                "exact-lane ones (an `auto` tenant's requests for a gated model take the "
                "exact lane): Envoy enforces a gate for the fast lane, the routing stage "
                "for the exact lane, and one gate cannot be both; give the tenants that "
                "use its models one lane, or limit their `models` (docs/fast-lane.md)",
            )
        elif gate.max_tokens is not None:
            yield at.error(
                ("routes", r, "concurrency", "max_tokens"),
                f"route '{route.name}'s gate is Envoy's (only fast-lane requests reach "
                "it), which counts requests in flight, not tokens: use max_requests "
                "(docs/fast-lane.md)",
            )


def _token_estimates(doc: Document, at: Locator, admission: Admission) -> Iterator[Problem]:
    """An estimate above max_output_tokens could never be asked for explicitly."""
    most = admission.max_output_tokens
    if admission.default_max_tokens > most:
        yield at.error(
            ("admission", "default_max_tokens"),
            f"default_max_tokens ({admission.default_max_tokens}) is larger than "
            f"max_output_tokens ({most})",
        )
    for r, route in doc.routes:
        if route.default_max_tokens is not None and route.default_max_tokens > most:
            yield at.error(
                ("routes", r, "default_max_tokens"),
                f"route '{route.name}': default_max_tokens ({route.default_max_tokens}) is "
                f"larger than admission.max_output_tokens ({most})",
            )


def check_tenants(doc: Document, at: Locator) -> Iterable[Problem]:
    """Each tenant's priority class and models exist; a tenant without keys is unusable."""
    classes = None if doc.admission is None else tuple(dict.fromkeys(doc.admission.class_names))
    served: dict[str, None] = {}  # every model some route serves, in file order
    for _, route in doc.routes:
        served.update(dict.fromkeys(route.models))
    for t, tenant in doc.tenants:
        wanted = tenant.priority
        if wanted is not None and classes is not None and wanted not in classes:
            yield at.error(
                ("tenants", t, "priority"),
                _unknown("priority class", wanted, classes),
            )
        # A route that failed validation may be the one serving the model.
        if tenant.models is not None and doc.complete:
            for m, model in enumerate(tenant.models):
                if model not in served:
                    yield at.error(
                        ("tenants", t, "models", m),
                        f"tenant '{tenant.name}' may use model '{model}', which no route "
                        f"serves (served: {', '.join(served) or 'none'})"
                        + _did_you_mean(model, tuple(served)),
                    )
        if not tenant.keys:
            yield at.warning(
                ("tenants", t, "name"),
                f"tenant '{tenant.name}' has no keys, so no request can reach it",
            )


def check_client_keys(doc: Document, at: Locator) -> Iterable[Problem]:
    """Key names label metrics, so they are unique across tenants; a key has one owner."""
    by_name: dict[str, KeyRef] = {}
    by_hash: dict[tuple[bytes, bytes], KeyRef] = {}
    for ref in doc.client_keys:
        path = ("tenants", ref.tenant, "keys", ref.index)
        first = by_name.setdefault(ref.key.name, ref)
        if first is not ref:
            earlier = ("tenants", first.tenant, "keys", first.index, "name")
            yield at.error(
                (*path, "name"),
                f"duplicate key name '{ref.key.name}' (first at {_where(at, earlier)}); key "
                "names are unique across all tenants",
            )
        first = by_hash.setdefault(parse_key_hash(ref.key.hash), ref)
        if first is not ref:
            earlier = ("tenants", first.tenant, "keys", first.index, "hash")
            yield at.error(
                (*path, "hash"),
                f"key '{ref.key.name}' has the same hash as key '{first.key.name}' of tenant "
                f"'{first.tenant_name}' (at {_where(at, earlier)}); one API key belongs to "
                "one key entry: make a new key with `sluicegate hash-key --generate`",
            )


def check_scenarios(doc: Document, at: Locator) -> Iterable[Problem]:
    """Declared scenarios are unique; a route names a declared one (or the implicit
    DEFAULT_SCENARIO, which is never written in `scenarios:` but always exists)."""
    if doc.scenarios is None:
        return  # `scenarios:` is no list: reported by the schema
    first: dict[str, int] = {}
    for index, name in doc.scenarios:
        if name in first:
            earlier = ("scenarios", first[name])
            yield at.error(
                ("scenarios", index),
                f"duplicate scenario '{name}' (first at {_where(at, earlier)})",
            )
        else:
            first[name] = index
    known = (DEFAULT_SCENARIO, *(name for name in first if name != DEFAULT_SCENARIO))
    for ref in doc.route_scenarios:
        if ref.scenario not in known:
            message = _unknown("scenario", ref.scenario, known)
            if "did you mean" not in message:
                message += "; declare it in the top-level `scenarios:` list"
            yield at.error(
                ("routes", ref.route, "scenario"), f"route '{ref.route_name}': {message}"
            )


def check_access_log(doc: Document, at: Locator) -> Iterable[Problem]:
    """A file access log whose directory does not exist (here) cannot be written; only a
    warning, since the process that writes it may run where the directory does exist."""
    access_log = doc.access_log
    if access_log is None or access_log.path == ACCESS_LOG_STDOUT:
        return
    directory = os.path.dirname(access_log.path)
    if not os.path.isdir(directory):
        yield at.warning(
            ("access_log", "path"),
            f"directory {directory} does not exist here, so the access log cannot be "
            "written until it does",
        )


def _unknown_provider(name: str, known: tuple[str, ...]) -> str:
    return _unknown("provider", name, known)


def _unknown(kind: str, name: str, known: tuple[str, ...]) -> str:
    message = f"unknown {kind} '{name}' (known: {', '.join(known) or 'none'})"
    return message + _did_you_mean(name, known)


def _did_you_mean(name: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _where(at: Locator, path: tuple[str | int, ...]) -> str:
    return f"{format_key_path(path)}, line {at.source.line_of(path)}"


def check_envoy_admin(doc: Document, at: Locator) -> Iterable[Problem]:
    """Envoy's admin has no authentication: whoever reaches it can set Envoy's log level
    to debug (Envoy then logs client and provider keys) or stop Envoy. Warn when it is
    TCP beyond loopback. Loopback TCP (the quickstart's default) stays quiet: only local
    users reach it, and the debug log they could turn on is written 0600 by the launcher
    (a DoS risk on a shared host, which docs/operations.md "Envoy's admin" covers; a
    warning on every file with the default would be noise that teaches to ignore it)."""
    address = doc.addresses.get("envoy_admin")
    if address is None:
        return  # reported by the schema
    admin = parse_admin_address(address)
    if admin.is_loopback:
        return
    path: KeyPath = ("sluicegate", "envoy_admin")
    yield at.warning(
        path,
        f"Envoy's admin on {address} is reachable from other machines; whoever reaches it "
        "can set Envoy's log level to debug (Envoy then logs client keys) or stop Envoy: "
        "use unix:/path/admin.sock (a socket only Envoy's user may open) or a loopback "
        "address",
    )


RULES: tuple[Rule, ...] = (
    check_unique_names,
    check_backends,
    check_models,
    check_provider_use,
    check_tls,
    check_provider_gates,
    check_gate_shares,
    check_unshared_limits,
    check_mock_urls,
    check_protocols,
    check_routing,
    check_health_checks,
    check_resilience,
    check_admission,
    check_lane,
    check_fast_lane_gates,
    check_auto_lane,
    check_tenants,
    check_client_keys,
    check_scenarios,
    check_access_log,
    check_sockets,
    check_envoy_admin,
)
