"""Schema v1 of sluicegate's YAML: what a user may write, with defaults.

The models only describe shape and local rules (types, ranges, URL form).
Rules that span the document (dangling references, duplicate names) live in
`validate.py`, so that every problem in a file is reported at once.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from sluicegate.wire import (
    ANSWERED_ROUTE_PREFIX,
    RESERVED_ROUTE_NAMES,
    is_reserved_route_name,
)

from .addresses import is_ip_address, split_host_port
from .admin_address import parse_admin_address
from .admission import (
    NAME_PATTERN,
    Admission,
    Concurrency,
    RateLimits,
    Tenant,
    check_label_name,
    check_model_names,
)
from .durations import Duration
from .headers import check_fixed_name, check_forwarded_name, check_header_value, check_unique
from .key_source import KeySource
from .lane_rules import Declared, with_default_lane
from .resilience import (
    HealthCheck,
    OutlierDetection,
    Pool,
    Protocol,
    Resilience,
    Retries,
    Timeouts,
)


class Strict(BaseModel):
    """Base for every section: unknown keys are errors, values are not coerced across types."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Name = str  # a DNS-label-like identifier, checked by `NAME_PATTERN` (admission.py)

# The scenario of a route that names none: always declared, without being written in
# `scenarios:` (docs/configuration.md, "Scenarios").
DEFAULT_SCENARIO: Final = "default"
# Scenarios label metrics, so their number stays small (the implicit default aside).
MAX_SCENARIOS: Final = 32
# `access_log.path` writing to sluicegate's standard output instead of a file.
ACCESS_LOG_STDOUT: Final = "stdout"
NATIVE_OFF: Final = "off"
NATIVE_AUTO: Final = "auto"
NATIVE_NODE: Final = "node"


class Listener(Strict):
    """Where Envoy accepts client traffic."""

    name: str = Field(pattern=NAME_PATTERN)
    address: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    # gateway: shared entry point for many apps; sidecar: next to one service.
    role: Literal["gateway", "sidecar"] = "gateway"

    @field_validator("address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        # Envoy binds listeners to IP addresses only; a hostname is NACKed at runtime.
        if not is_ip_address(value):
            raise ValueError(
                f"address must be an IP address such as 127.0.0.1 or ::, got {value!r}"
            )
        return value


class Tls(Strict):
    """Upstream TLS. With an https base_url TLS is on; SNI defaults to the URL's host."""

    sni: str | None = None
    # PEM bundle to verify the provider's certificate; default: the system CA bundle.
    ca_file: str | None = None
    insecure_skip_verify: bool = False


class MockProvider(Strict):
    """Marks a provider as a mock that `sluicegate up` starts itself (demo, tests, drills)."""

    models: list[str] = Field(default_factory=list)
    ttft_ms: float = Field(default=80.0, ge=0)
    itl_ms: float = Field(default=15.0, ge=0)
    jitter_ms: float = Field(default=0.0, ge=0)
    output_tokens: int = Field(default=24, ge=1, le=100_000)


class Provider(Strict):
    """An OpenAI-compatible API reachable at base_url."""

    name: str = Field(pattern=NAME_PATTERN)
    base_url: str
    api_key: KeySource | None = None
    tls: Tls | None = None
    # model name the client asks for -> model name this provider knows it by
    model_map: dict[str, str] = Field(default_factory=dict)
    mock: MockProvider | None = None
    # HTTP/1.1 (keep-alive, one request per connection at a time) or HTTP/2 (many streams
    # per connection; tune it with pool.http2). One route's providers must agree: Envoy
    # sets the protocol per route cluster.
    protocol: Protocol = "http1"
    # Optional active health checks of this provider (resilience.HealthCheck).
    health_check: HealthCheck | None = None
    # Take no new requests (requests in flight finish); `sluicegate drain` does the same live.
    drain: bool = False
    # A priority gate in front of this provider (e.g. a self-hosted model that serves N
    # requests at once), shared by every route that sends to it alone.
    concurrency: Concurrency | None = None
    # Rate limits of this provider (an account's RPM/TPM), counted like the gate: for the
    # routes that send to this provider alone.
    rate_limits: RateLimits | None = None
    # Fixed request headers sent to this provider, e.g. {OpenAI-Organization: org-...};
    # they replace a client's. Not secret: config dumps show them (keys go in api_key).
    headers: dict[str, str] = Field(default_factory=dict, max_length=32)
    # Client request headers this provider receives beyond the built-in allowlist: names,
    # or `prefix*` (docs/architecture.md, "What a provider receives").
    forward_headers: list[str] = Field(default_factory=list, max_length=24)
    # Ask for a stream's usage event (`stream_options.include_usage`) when the client did
    # not, to count its tokens exactly (docs/admission.md, "Reserve, then reconcile").
    # false for a provider that refuses `stream_options`: its streams are then counted.
    ask_stream_usage: bool = True

    @field_validator("name")
    @classmethod
    def _not_a_label_of_its_own(cls, value: str) -> str:
        return check_label_name(value)

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, value: dict[str, str]) -> dict[str, str]:
        check_unique([check_fixed_name(name) for name in value], "headers")
        return {check_fixed_name(name): check_header_value(name, v) for name, v in value.items()}

    @field_validator("forward_headers")
    @classmethod
    def _valid_forward_headers(cls, value: list[str]) -> list[str]:
        names = [check_forwarded_name(name) for name in value]
        check_unique(names, "forward_headers")
        return names

    @field_validator("base_url")
    @classmethod
    def _valid_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise ValueError("base_url must start with http:// or https://")
        if not parts.hostname:
            raise ValueError("base_url has no host")
        try:
            _ = parts.port
        except ValueError as exc:
            raise ValueError(f"base_url has a bad port: {exc}") from None
        if parts.query or parts.fragment:
            raise ValueError("base_url must not have a query or fragment")
        if parts.username is not None or parts.password is not None:
            # Never echo the URL: the user part may be a credential.
            raise ValueError("base_url must not contain user:password@; use api_key instead")
        return value

    @property
    def health_check_path(self) -> str | None:
        """The path Envoy health-checks (None without a health check): the check's own
        path, else `<base_url path>/models` (answered without an API key by most providers)."""
        if self.health_check is None:
            return None
        return self.health_check.path or f"{urlsplit(self.base_url).path.rstrip('/')}/models"


class Backend(Strict):
    """One provider serving a route, with its share of traffic."""

    provider: str
    weight: int = Field(default=1, ge=1, le=1_000_000)
    # 0 serves first; higher numbers are fallbacks used when lower ones are unhealthy.
    priority: int = Field(default=0, ge=0, le=10)


class FaultDelay(Strict):
    """Hold a share of requests before they go to a provider."""

    percent: float = Field(ge=0, le=100)
    duration: Duration


class FaultAbort(Strict):
    """Answer a share of requests with an error instead of calling a provider."""

    percent: float = Field(ge=0, le=100)
    status: int = Field(default=503, ge=400, le=599)


class Fault(Strict):
    """A failover drill on one route: Envoy's fault filter delays or aborts requests."""

    delay: FaultDelay | None = None
    abort: FaultAbort | None = None


def normalize_path_prefix(prefix: str) -> str:
    """Treat a prefix as a directory: "/v1" and "/v1/" both become "/v1/"; "/" stays "/".
    So "/openai" does not match "/openaiX", and two spellings of one prefix are one."""
    return prefix.rstrip("/") + "/"


Routing = Literal["static", "latency"]
ROUTING_LATENCY: Final = "latency"


class Route(Strict):
    """Requests for some models (optionally under a path prefix) go to these backends."""

    name: str = Field(pattern=NAME_PATTERN)
    models: list[str] = Field(min_length=1)
    path_prefix: str = Field(default="/v1/", pattern=r"^/")
    backends: list[Backend] = Field(min_length=1)
    # Overrides of the top-level `defaults:`; only the fields written here change.
    pool: Pool | None = None
    timeouts: Timeouts | None = None
    retries: Retries | None = None
    outlier_detection: OutlierDetection | None = None
    # Drills only: delay or abort a share of this route's requests.
    fault: Fault | None = None
    # Rate limits per model of this route: each model is counted on its own.
    rate_limits: RateLimits | None = None
    # Output-token estimate for requests without max_tokens; overrides admission's.
    default_max_tokens: int | None = Field(default=None, ge=1, le=100_000_000)
    # In-flight gate whose waiting requests are served by priority class.
    concurrency: Concurrency | None = None
    # What its requests are reported as (one of `scenarios:`); unset: DEFAULT_SCENARIO.
    scenario: str | None = Field(default=None, pattern=NAME_PATTERN)
    # How its providers share traffic within a priority level: the configured weights
    # (`static`), or weights the control plane learns from each provider's time to first
    # token and errors, the configured ones as the prior (`latency`; docs/latency-routing.md).
    routing: Routing = "static"

    @field_validator("models")
    @classmethod
    def _non_empty_models(cls, value: list[str]) -> list[str]:
        return check_model_names(value)

    @field_validator("name")
    @classmethod
    def _not_reserved_name(cls, value: str) -> str:
        if is_reserved_route_name(value):
            names = ", ".join(repr(name) for name in RESERVED_ROUTE_NAMES)
            raise ValueError(
                f"{value!r} is reserved (Envoy's own routes and the metric labels of unknown "
                f"and missing routes take these names, so its records and series would "
                f"merge with theirs): choose another name (not {names} or one starting "
                f"{ANSWERED_ROUTE_PREFIX!r})"
            )
        return value


class Addresses(Strict):
    """Where sluicegate's own servers listen (quickstart defaults)."""

    xds: str = "127.0.0.1:18000"
    ext_proc: str = "127.0.0.1:18001"
    http: str = "127.0.0.1:9100"
    # Envoy's admin API: `host:port`, or `unix:/path` for a socket only Envoy's user may
    # open (admin_address.py says why; `validate` warns about TCP outside the quickstart).
    envoy_admin: str = "127.0.0.1:9901"
    # More ext_proc servers that `up` starts (`sluicegate ext-proc`); Envoy spreads requests
    # over all of them. Limits are then only shared through a Redis store.
    ext_proc_replicas: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("xds", "ext_proc", "http")
    @classmethod
    def _host_port(cls, value: str) -> str:
        split_host_port(value)  # raises ValueError with the reason
        return value

    @field_validator("envoy_admin")
    @classmethod
    def _admin_address(cls, value: str) -> str:
        parse_admin_address(value)  # raises ValueError with the reason
        return value

    @field_validator("ext_proc_replicas")
    @classmethod
    def _host_ports(cls, value: list[str]) -> list[str]:
        for address in value:
            split_host_port(address)
        return value

    @property
    def ext_proc_servers(self) -> list[str]:
        """Every ext_proc address Envoy calls: the main one, then the replicas."""
        return [self.ext_proc, *self.ext_proc_replicas]


class Limits(Strict):
    """Request-path limits that later admission work builds on."""

    # Largest request body the ext_proc filter buffers; above it Envoy answers 413.
    max_request_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    # How long Envoy waits for the ext_proc server per message.
    ext_proc_message_timeout_ms: int = Field(default=5_000, ge=10, le=600_000)
    # Slow and abusive clients (docs/operations.md, "Slow and abusive clients"); 0 = off.
    # From a request's first byte to its last header: a client's headers are tiny.
    request_headers_timeout: Duration = Field(default=10_000, ge=0)
    # From a request's first byte to its last body byte (a 4 MB body at 100 KB/s fits);
    # the time the gateway itself holds the body (queue wait) is added in translation.
    request_timeout: Duration = Field(default=60_000, ge=0)
    # Open client connections per listener; more are closed at once.
    max_connections_per_listener: int = Field(default=10_000, ge=1, le=1_000_000)


def _absolute_path(value: str, words: tuple[str, ...], example: str) -> str:
    """`value` if it is one of `words` or an absolute path without control characters (a
    relative one would depend on the directory each process was started in)."""
    if value in words:
        return value
    if not value.startswith("/"):
        either = " or ".join(f"'{word}'" for word in words)
        raise ValueError(f"must be {either} or an absolute file path such as {example}, "
                         f"got {value!r}")  # fmt: skip
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        raise ValueError("the path holds a control character")
    return value


class AccessLog(Strict):
    """An optional structured access log: one JSON line per request, never a key."""

    # ACCESS_LOG_STDOUT, or an absolute file path.
    path: str

    @field_validator("path")
    @classmethod
    def _stdout_or_absolute(cls, value: str) -> str:
        return _absolute_path(value, (ACCESS_LOG_STDOUT,), "/var/log/sluicegate/access.log")


class NativeFilters(Strict):
    """sluicegate's native filters: a C library Envoy loads as a dynamic module, in place
    of Envoy's own filters where it has one (docs/native-filters.md)."""

    # NATIVE_NODE: each Envoy the library its bootstrap names (node metadata), Envoy's own
    # filters for an Envoy that names none. NATIVE_OFF: Envoy's own filters. NATIVE_AUTO:
    # the control plane builds the library (gcc) and names it by its path to every Envoy,
    # for Envoys on the same machine; Envoy's own filters if it cannot. Or the library's
    # absolute path on every Envoy's machine.
    module: str = NATIVE_NODE

    @field_validator("module", mode="before")
    @classmethod
    def _off_unquoted(cls, value: object) -> object:
        # YAML 1.1 reads an unquoted `off` (and `no`, `false`) as false.
        return NATIVE_OFF if value is False else value

    @field_validator("module")
    @classmethod
    def _word_or_absolute(cls, value: str) -> str:
        return _absolute_path(
            value,
            (NATIVE_NODE, NATIVE_OFF, NATIVE_AUTO),
            "/opt/sluicegate/libsluicegate_native.so",
        )


ScenarioName = Annotated[str, Field(pattern=NAME_PATTERN), AfterValidator(check_label_name)]


class Config(Strict):
    """A whole sluicegate document (schema version 1)."""

    version: Literal[1]
    sluicegate: Addresses = Field(default_factory=Addresses)
    limits: Limits = Field(default_factory=Limits)
    # Pools, timeouts, retries and outlier detection for every route (resilience.py).
    defaults: Resilience = Field(default_factory=Resilience)
    listeners: list[Listener] = Field(min_length=1)
    providers: list[Provider] = Field(min_length=1)
    routes: list[Route] = Field(min_length=1)
    # Priority classes, token estimates and the limiter store (admission.py).
    admission: Admission = Field(default_factory=Admission)
    # Who may call: client keys, limits, models, priority (empty: keys are not checked).
    tenants: list[Tenant] = Field(default_factory=list)
    # Names requests are reported under (routes[].scenario, or a client's header); with
    # DEFAULT_SCENARIO always declared besides these.
    scenarios: list[ScenarioName] = Field(default_factory=list, max_length=MAX_SCENARIOS)
    # Optional structured access log (JSON lines to a file or stdout).
    access_log: AccessLog | None = None
    # sluicegate's C filters in Envoy, or Envoy's own (the default).
    native_filters: NativeFilters = Field(default_factory=NativeFilters)

    @model_validator(mode="after")
    def _default_lane(self) -> Config:
        # admission.lane left out depends on the whole document (lane_rules.py); the
        # config is frozen, so the resolved section is put in place once, here.
        declared = Declared(
            tenants=self.tenants,
            providers=self.providers,
            routes=self.routes,
        )
        admission = with_default_lane(self.admission, declared)
        object.__setattr__(self, "admission", admission)
        return self

    def ext_proc_processes(self) -> int:
        """How many ext_proc servers count limits and gates (`count_ext_proc_processes`)."""
        return count_ext_proc_processes(
            len(self.sluicegate.ext_proc_replicas), self.admission.store.replicas
        )

    def declared_rate_limits(self) -> list[RateLimits]:
        """Every rate_limits block: tenants', keys', routes' and providers'."""
        found = [tenant.rate_limits for tenant in self.tenants]
        found += [key.rate_limits for tenant in self.tenants for key in tenant.keys]
        found += [route.rate_limits for route in self.routes]
        found += [provider.rate_limits for provider in self.providers]
        return [limits for limits in found if limits is not None]

    def counts_tokens(self) -> bool:
        """Whether any limit counts tokens: then each reservation is reconciled to the real
        usage of its response (docs/admission.md, "Reserve, then reconcile")."""
        return any(
            kind != "requests"
            for limits in self.declared_rate_limits()
            for kind, _limit, _window in limits.limits()
        )


def count_ext_proc_processes(replica_count: int, store_replicas: int) -> int:
    """How many ext_proc servers share the limits and gates: the main one plus the
    `sluicegate.ext_proc_replicas` that `up` starts, or `admission.store.replicas` when
    that says more run elsewhere. Each gate's share is its total divided by this."""
    return max(1 + replica_count, store_replicas)
