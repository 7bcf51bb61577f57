"""Providers as Envoy and the filter see them: the URL taken apart, TLS, health check, key.

A provider is resolved once per load (`resolve_provider`); every consumer reads these
fields instead of parsing `base_url` again.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from sluicegate import config

Scheme = Literal["http", "https"]

# Used when a provider's TLS section names no CA bundle (Debian/Ubuntu location).
SYSTEM_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
# A mock provider's per-request knobs (sluicegate/provider/faults.py) are its API, so a
# provider with `mock:` receives them; any other provider only if its forward_headers
# say so (a test that runs its own mocks: `forward_headers: ["x-mock-*"]`).
MOCK_KNOBS = "x-mock-*"


@dataclass(frozen=True, slots=True)
class Tls:
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
class HealthCheck:
    """One provider's active health check, its path resolved against the base URL."""

    path: str
    interval_ms: int
    timeout_ms: int
    unhealthy_threshold: int
    healthy_threshold: int
    statuses: tuple[tuple[int, int], ...]  # inclusive (low, high) ranges


@dataclass(frozen=True, slots=True)
class Provider:
    """One OpenAI-compatible upstream, with its URL already taken apart."""

    name: str
    scheme: Scheme
    host: str  # lower-case, IPv6 without brackets
    port: int  # explicit or the scheme's default
    path_prefix: str  # URL path without trailing slash: "/v1", "/api/paas/v4" or ""
    # "Bearer <key>", or None when the provider takes no key. Only the translator's
    # secrets.py reads it: the key reaches Envoy as an SDS secret, never in a cluster,
    # route or endpoint metadata.
    authorization: str | None
    model_map: tuple[tuple[str, str], ...]  # (client model, provider model), sorted
    tls: Tls | None  # set exactly when scheme is https
    protocol: config.Protocol = "http1"
    health_check: HealthCheck | None = None
    # Admission: a gate in front of this provider and its own rate limits; both cover
    # only the routes that send to this provider alone (Route.sole_provider, Route.gates).
    concurrency: config.Concurrency | None = None
    rate_limits: config.RateLimits | None = None
    # What this provider receives beyond the translator's built-in allowlist of client
    # headers (xds/translate/forwarded_headers.py): more client headers (names, or
    # `prefix*`), and fixed headers of its own. Lower-case names, sorted.
    forward_headers: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    # May be asked for a stream's usage event (config.Provider.ask_stream_usage).
    ask_stream_usage: bool = True

    @property
    def is_ip(self) -> bool:
        """IP literal hosts need no DNS, so their routes can use EDS."""
        return is_ip(self.host)

    @property
    def authority(self) -> str:
        """The Host header an HTTP client would send: the port only when not the default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def upstream_model(self, model: str) -> str:
        """The name this provider knows `model` by."""
        return dict(self.model_map).get(model, model)


@functools.lru_cache(maxsize=4096)
def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def resolve_provider(provider: config.Provider, key: str | None) -> Provider:
    """Take a configured provider apart. `key` is its resolved API key (None or blank:
    the provider gets no Authorization header)."""
    parts = urlsplit(provider.base_url)
    scheme: Scheme = "https" if parts.scheme == "https" else "http"
    host = parts.hostname or ""
    port = parts.port or (443 if scheme == "https" else 80)
    return Provider(
        name=provider.name,
        scheme=scheme,
        host=host,
        port=port,
        path_prefix=parts.path.rstrip("/"),
        authorization=_authorization(key),
        model_map=tuple(sorted(provider.model_map.items())),
        tls=_tls(provider, host) if scheme == "https" else None,
        protocol=provider.protocol,
        health_check=_health_check(provider),
        concurrency=provider.concurrency,
        rate_limits=provider.rate_limits,
        forward_headers=tuple(
            sorted({*provider.forward_headers, *([MOCK_KNOBS] if provider.mock else [])})
        ),
        headers=tuple(sorted(provider.headers.items())),
        ask_stream_usage=provider.ask_stream_usage,
    )


def _authorization(key: str | None) -> str | None:
    """`config.resolve_api_keys` hands over keys it has checked (no whitespace or control
    character inside, which would corrupt the header): only blank means no key."""
    if key is None or not key.strip():
        return None
    return f"Bearer {key.strip()}"


def _tls(provider: config.Provider, host: str) -> Tls:
    settings = provider.tls
    sni = settings.sni if settings and settings.sni else (None if is_ip(host) else host)
    verify_name = sni or host
    skip = bool(settings and settings.insecure_skip_verify)
    return Tls(
        sni=sni,
        verify_name=verify_name,
        verify_is_ip=is_ip(verify_name),
        ca_file=None if skip else ((settings and settings.ca_file) or SYSTEM_CA_FILE),
        alpn=("h2",) if provider.protocol == "http2" else (),
    )


def _health_check(provider: config.Provider) -> HealthCheck | None:
    check, path = provider.health_check, provider.health_check_path
    if check is None or path is None:
        return None
    return HealthCheck(
        path=path,
        interval_ms=check.interval,
        timeout_ms=check.timeout,
        unhealthy_threshold=check.unhealthy_threshold,
        healthy_threshold=check.healthy_threshold,
        statuses=tuple(check.status_ranges()),
    )
