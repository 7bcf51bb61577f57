"""The gateway's intermediate representation: config facts resolved once, before any protobuf.

`build_ir` turns a validated `Config` plus the resolved API keys into frozen dataclasses
that already hold every derived fact the Envoy resources need (ports, URL path prefixes,
normalised route prefixes, per-route rewriting needs). Each resource module then only
*formats*; no module re-parses URLs or re-derives a rule, so the rules live in one place
and the unit tests can check them without looking at protobuf.

Everything here is pure: no environment, no files, no clock. Keys arrive in `api_keys`.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from sluicegate.config import (
    Config,
    Fault,
    HealthCheck,
    Protocol,
    Provider,
    Resilience,
    Route,
    effective,
)

Role = Literal["gateway", "sidecar"]
Scheme = Literal["http", "https"]

# Used when a provider's TLS section names no CA bundle (Debian/Ubuntu location).
SYSTEM_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"

CLUSTER_PREFIX = "route-"
LISTENER_PREFIX = "listener-"
ROUTE_CONFIG_PREFIX = "routes-"


class TranslateError(ValueError):
    """The config cannot be expressed as Envoy resources (a rule spanning several sections)."""


@dataclass(frozen=True, slots=True)
class TlsIR:
    """Upstream TLS for one provider.

    `sni` is None only for an IP-literal host without an explicit SNI: a TLS client
    must not send an IP address as SNI (RFC 6066 §3). `verify_name` is what the
    certificate's subjectAltName must match; `ca_file` None means no verification.
    """

    sni: str | None
    verify_name: str
    verify_is_ip: bool
    ca_file: str | None
    # ALPN offered in the handshake: ("h2",) for HTTP/2 providers, else none (HTTP/1.1).
    alpn: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HealthCheckIR:
    """One provider's active health check, its path resolved against the base URL."""

    path: str
    interval_ms: int
    timeout_ms: int
    unhealthy_threshold: int
    healthy_threshold: int
    statuses: tuple[tuple[int, int], ...]  # inclusive (low, high) ranges


@dataclass(frozen=True, slots=True)
class ProviderIR:
    """One OpenAI-compatible upstream, with its URL already taken apart."""

    name: str
    scheme: Scheme
    host: str  # lower-case, IPv6 without brackets
    port: int  # explicit or the scheme's default
    path_prefix: str  # URL path without trailing slash: "/v1", "/api/paas/v4" or ""
    # "Bearer <key>", or None when the provider takes no key. Only secrets.py reads it: the
    # key reaches Envoy as an SDS secret, never in a cluster, route or endpoint metadata.
    authorization: str | None
    model_map: tuple[tuple[str, str], ...]  # (client model, provider model), sorted
    tls: TlsIR | None  # set exactly when scheme is https
    protocol: Protocol = "http1"
    health_check: HealthCheckIR | None = None

    @property
    def is_ip(self) -> bool:
        """IP literal hosts need no DNS, so their routes can use EDS."""
        return _is_ip(self.host)

    @property
    def authority(self) -> str:
        """The Host header an HTTP client would send: the port only when not the default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def upstream_model(self, model: str) -> str:
        """The name this provider knows `model` by."""
        return dict(self.model_map).get(model, model)


@dataclass(frozen=True, slots=True)
class BackendIR:
    provider: ProviderIR
    weight: int
    priority: int  # dense rank within the route: 0, 1, 2 … (config may skip numbers)


@dataclass(frozen=True, slots=True)
class RouteIR:
    """Requests for `models` under `path_prefix`, served by one cluster of providers."""

    name: str
    models: tuple[str, ...]
    # Always ends with "/": the prefix is a directory, so "/openai" does not match
    # "/openaiX" and the rewrite to a provider's prefix can keep the slash.
    path_prefix: str
    backends: tuple[BackendIR, ...]  # sorted by (priority, provider name)
    # Pools, timeouts, retries, outlier detection: `defaults` merged with the route's own.
    settings: Resilience = field(default_factory=Resilience)
    fault: Fault | None = None  # a failover drill (Envoy's fault filter), usually None

    @property
    def cluster_name(self) -> str:
        return f"{CLUSTER_PREFIX}{self.name}"

    @property
    def uses_eds(self) -> bool:
        """EDS when every host is an IP literal; otherwise Envoy resolves names (DNS)."""
        return all(backend.provider.is_ip for backend in self.backends)

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
    def protocol(self) -> Protocol:
        """The one upstream protocol of the route's providers (validated to agree)."""
        return self.backends[0].provider.protocol

    @property
    def priority_levels(self) -> int:
        return 1 + max(backend.priority for backend in self.backends)

    @property
    def first_level_size(self) -> int:
        """Providers at priority 0: how many a retry tries before moving down a level."""
        return sum(1 for backend in self.backends if backend.priority == 0)

    @property
    def health_check(self) -> HealthCheckIR | None:
        """The route's active health check: that of its health-checked providers (which
        validation makes agree), or None when no provider has one."""
        checks = [b.provider.health_check for b in self.backends if b.provider.health_check]
        return checks[0] if checks else None

    def model_map_for(self, provider: ProviderIR) -> dict[str, str]:
        """The provider's renames restricted to this route's models (nothing else leaks)."""
        return {
            model: provider.upstream_model(model)
            for model in self.models
            if provider.upstream_model(model) != model
        }


@dataclass(frozen=True, slots=True)
class ListenerIR:
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
class LimitsIR:
    max_request_body_bytes: int
    ext_proc_message_timeout_ms: int


@dataclass(frozen=True, slots=True)
class AdmissionIR:
    """What the admission work in ext_proc needs from Envoy's side of the config.

    enabled: tenants, rate limits or a concurrency gate exist, so admitted responses carry
    x-ratelimit-* headers from dynamic metadata. observe_usage: token limits exist, so real
    usage is read off responses (usage.py) to reconcile reservations. longest_queue_wait_ms:
    how long the routing stage may hold a request in a priority queue before answering.
    keys_required: tenants exist, so every request under a route prefix needs a client key,
    model listings included (they then go through ext_proc, which also lists a tenant
    only the models it may use).
    """

    enabled: bool = False
    keys_required: bool = False
    observe_usage: bool = False
    longest_queue_wait_ms: int = 0


@dataclass(frozen=True, slots=True)
class GatewayIR:
    """Everything the Envoy resources are made from. Listeners and providers are sorted by
    name; routes keep config order because the first matching route wins."""

    listeners: tuple[ListenerIR, ...]
    providers: tuple[ProviderIR, ...]
    routes: tuple[RouteIR, ...]
    limits: LimitsIR
    admission: AdmissionIR = AdmissionIR()

    @property
    def path_prefixes(self) -> tuple[str, ...]:
        """Distinct route prefixes, sorted: each gets its own `<prefix>models` listing."""
        return tuple(sorted({route.path_prefix for route in self.routes}))


def build_ir(config: Config, api_keys: Mapping[str, str | None]) -> GatewayIR:
    """Resolve `config` into a `GatewayIR`.

    `api_keys` maps a provider name to its resolved key (the loader reads env vars and
    files; translation stays pure). A provider whose key is absent, None or empty gets
    no Authorization header upstream, and the client's own header is removed either way.

    Raises `TranslateError` for input the schema alone cannot reject: a backend naming
    an unknown provider, one provider twice in a route, one model routed twice under the
    same prefix (the second route could never match), a key with control characters.
    """
    providers = {p.name: _provider_ir(p, api_keys.get(p.name)) for p in config.providers}
    if len(providers) != len(config.providers):
        raise TranslateError("provider names must be unique")
    routes = tuple(_route_ir(route, providers, config.defaults) for route in config.routes)
    _check_route_names(routes)
    _check_model_conflicts(routes)
    listeners = tuple(
        sorted(
            (ListenerIR(x.name, x.address, x.port, x.role) for x in config.listeners),
            key=lambda item: item.name,
        )
    )
    if len({item.name for item in listeners}) != len(listeners):
        raise TranslateError("listener names must be unique")
    return GatewayIR(
        listeners=listeners,
        providers=tuple(providers[name] for name in sorted(providers)),
        routes=routes,
        limits=LimitsIR(
            max_request_body_bytes=config.limits.max_request_body_bytes,
            ext_proc_message_timeout_ms=config.limits.ext_proc_message_timeout_ms,
        ),
        admission=_admission_ir(config),
    )


def _admission_ir(config: Config) -> AdmissionIR:
    """Admission is on once any tenant, rate limit or concurrency gate is declared."""
    gated = any(route.concurrency is not None for route in config.routes) or any(
        provider.concurrency is not None for provider in config.providers
    )
    enabled = bool(config.tenants) or gated or bool(config.declared_rate_limits())
    waits = [klass.max_wait for klass in config.admission.priority_classes] if gated else []
    return AdmissionIR(
        enabled=enabled,
        observe_usage=config.counts_tokens(),
        longest_queue_wait_ms=max(waits, default=0),
        keys_required=bool(config.tenants),
    )


def normalize_path_prefix(prefix: str) -> str:
    """Treat a prefix as a directory: "/v1" and "/v1/" both become "/v1/"; "/" stays "/"."""
    return prefix.rstrip("/") + "/"


@functools.lru_cache(maxsize=4096)
def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _provider_ir(provider: Provider, key: str | None) -> ProviderIR:
    parts = urlsplit(provider.base_url)
    scheme: Scheme = "https" if parts.scheme == "https" else "http"
    host = parts.hostname or ""
    port = parts.port or (443 if scheme == "https" else 80)
    authorization = None
    if key is not None and key.strip():
        key = key.strip()
        if any(ord(char) < 0x20 or ord(char) == 0x7F for char in key):
            raise TranslateError(f"provider {provider.name!r}: API key has control characters")
        authorization = f"Bearer {key}"
    tls = None
    if scheme == "https":
        settings = provider.tls
        sni = settings.sni if settings and settings.sni else (None if _is_ip(host) else host)
        verify_name = sni or host
        skip = bool(settings and settings.insecure_skip_verify)
        tls = TlsIR(
            sni=sni,
            verify_name=verify_name,
            verify_is_ip=_is_ip(verify_name),
            ca_file=None if skip else ((settings and settings.ca_file) or SYSTEM_CA_FILE),
            alpn=("h2",) if provider.protocol == "http2" else (),
        )
    return ProviderIR(
        name=provider.name,
        scheme=scheme,
        host=host,
        port=port,
        path_prefix=parts.path.rstrip("/"),
        authorization=authorization,
        model_map=tuple(sorted(provider.model_map.items())),
        tls=tls,
        protocol=provider.protocol,
        health_check=_health_check_ir(provider.health_check, parts.path.rstrip("/")),
    )


def _health_check_ir(check: HealthCheck | None, path_prefix: str) -> HealthCheckIR | None:
    if check is None:
        return None
    return HealthCheckIR(
        path=check.path or f"{path_prefix}/models",
        interval_ms=check.interval,
        timeout_ms=check.timeout,
        unhealthy_threshold=check.unhealthy_threshold,
        healthy_threshold=check.healthy_threshold,
        statuses=tuple(check.status_ranges()),
    )


def _route_ir(route: Route, providers: Mapping[str, ProviderIR], defaults: Resilience) -> RouteIR:
    seen: set[str] = set()
    for backend in route.backends:
        if backend.provider not in providers:
            raise TranslateError(
                f"route {route.name!r}: backend names unknown provider {backend.provider!r}"
            )
        if backend.provider in seen:
            raise TranslateError(
                f"route {route.name!r}: provider {backend.provider!r} is listed twice"
            )
        seen.add(backend.provider)
    # Dense priorities: Envoy would otherwise create empty priority levels for the gaps.
    levels = sorted({backend.priority for backend in route.backends})
    ranks = {priority: rank for rank, priority in enumerate(levels)}
    backends = sorted(
        (
            BackendIR(providers[b.provider], weight=b.weight, priority=ranks[b.priority])
            for b in route.backends
        ),
        key=lambda b: (b.priority, b.provider.name),
    )
    # Envoy sets protocol and active health checking per cluster, and a route is one.
    if len({b.provider.protocol for b in backends}) > 1:
        raise TranslateError(f"route {route.name!r}: providers speak different protocols")
    if len({b.provider.health_check for b in backends if b.provider.health_check}) > 1:
        raise TranslateError(f"route {route.name!r}: providers have different health checks")
    return RouteIR(
        name=route.name,
        models=tuple(dict.fromkeys(route.models)),
        path_prefix=normalize_path_prefix(route.path_prefix),
        backends=tuple(backends),
        settings=effective(defaults, route),
        fault=route.fault,
    )


def _check_route_names(routes: tuple[RouteIR, ...]) -> None:
    names = [route.name for route in routes]
    if len(set(names)) != len(names):
        raise TranslateError("route names must be unique")


def _check_model_conflicts(routes: tuple[RouteIR, ...]) -> None:
    owner: dict[tuple[str, str], str] = {}
    for route in routes:
        for model in route.models:
            key = (route.path_prefix, model)
            if key in owner:
                raise TranslateError(
                    f"model {model!r} under {route.path_prefix!r} is served by routes "
                    f"{owner[key]!r} and {route.name!r}; only the first could ever match"
                )
            owner[key] = route.name
