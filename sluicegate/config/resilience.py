"""Provider resilience settings: pools, tiered timeouts, retries, outlier detection, health checks.

Where each setting lives follows where Envoy applies it (docs/architecture.md,
"Routing across providers"): a route is one Envoy cluster whose hosts are its providers, so

- `pool`, `timeouts`, `retries` and `outlier_detection` are per route: a top-level
  `defaults:` section gives every route its values, and a route may override any field
  (`routes[].retries.max_retries: 4` keeps every other retry default);
- `protocol` and `health_check` are per provider (Envoy runs them per host), with the
  rule that one route's providers speak one protocol and share one health check.

Durations are written with a unit: `250ms`, `3s`, `1.5s`, `2m`, `1h`, `1m30s`; `0` turns a
timeout off where that is allowed. Every default below is documented in docs/configuration.md
and docs/resilience.md and chosen for LLM traffic (long streams, slow first tokens).
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from .durations import Duration

_M = TypeVar("_M", bound=BaseModel)


class _Section(BaseModel):
    """Unknown keys are errors, values are not coerced across types (as in schema.Strict)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- connection pools --------------------------------------------------------------------


class Http2(_Section):
    """HTTP/2 tuning, used for routes whose providers speak `protocol: http2`."""

    # Streams Envoy opens on one connection before it opens another.
    max_concurrent_streams: int = Field(default=100, ge=1, le=2_147_483_647)
    # PING on the connection this often and drop it when no answer comes within
    # keepalive_timeout: a dead connection is found before a request is sent on it.
    # 0 sends no pings.
    keepalive_interval: Duration = Field(default=30_000, ge=0)
    keepalive_timeout: Duration = Field(default=5_000, ge=1)


class Pool(_Section):
    """Connections to a route's providers (Envoy: circuit breakers and protocol options)."""

    # Whole route (all its providers together): open connections, requests waiting for a
    # connection, requests in flight. Above any of them a request fails at once with 503
    # `upstream_overflow` instead of queueing without bound.
    max_connections: int = Field(default=4096, ge=1, le=1_000_000)
    max_pending_requests: int = Field(default=1024, ge=1, le=1_000_000)
    max_requests: int = Field(default=4096, ge=1, le=1_000_000)
    # Per provider (Envoy: per host). 0 means no per-provider limit.
    max_connections_per_provider: int = Field(default=0, ge=0, le=1_000_000)
    # Close upstream connections idle this long. Keep it below the provider's keep-alive
    # (AWS load balancers close at 60 s, nginx at 75 s; uvicorn/vLLM at 5 s!) or a reused
    # connection may be closed under a request. 0 keeps idle connections forever.
    idle_timeout: Duration = Field(default=50_000, ge=0)
    # Open a new connection after this many requests on one; 0 means no limit.
    max_requests_per_connection: int = Field(default=0, ge=0, le=1_000_000_000)
    http2: Http2 = Field(default_factory=Http2)


# --- timeouts ----------------------------------------------------------------------------


class Timeouts(_Section):
    """Tiered timeouts; each firing one has its own error `code` (docs/architecture.md,
    "Errors the gateway makes")."""

    # TCP connect plus TLS handshake to a provider (Envoy: cluster connect_timeout).
    connect: Duration = Field(default=3_000, ge=1)
    # Per attempt of a non-streamed request: until the provider's response headers, which
    # come when the whole answer is ready, so this bounds the whole generation. 0: none.
    first_byte: Duration = Field(default=90_000, ge=0)
    # Per attempt of a streamed request (`"stream": true`): until the provider's response
    # headers, which come with the first token, so a hung provider is left this soon for
    # another. Once headers are forwarded it stops: it never cuts a stream. 0: none.
    # Unset: `stream_first_token` (15 s, or first_byte when that is shorter).
    first_token: Duration | None = Field(default=None, ge=0)
    # Per attempt: longest silence from the provider, also before the first byte;
    # restarts on every byte, so a stream that keeps producing is never cut. 0: none.
    idle: Duration = Field(default=120_000, ge=0)
    # The whole request, all attempts and back-offs included; it DOES cut a stream that
    # is still producing. 0: none (Envoy's own default of 15 s would cut long streams).
    total: Duration = Field(default=600_000, ge=0)

    @property
    def stream_first_token(self) -> int:
        """The per-attempt wait for a stream's first token: `first_token` as written, else
        15 s but never longer than `first_byte` (a route that leaves a slow non-streamed
        attempt sooner than that leaves a stream at least as soon)."""
        if self.first_token is not None:
            return self.first_token
        return min(DEFAULT_FIRST_TOKEN_MS, self.first_byte or DEFAULT_FIRST_TOKEN_MS)


DEFAULT_FIRST_TOKEN_MS = 15_000


# --- retries -----------------------------------------------------------------------------

RETRY_CONDITIONS = ("connect-failure", "reset", "refused-stream")


def _retry_condition(value: object) -> object:
    if isinstance(value, str) and value in RETRY_CONDITIONS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
        return value
    shown = repr(value) if isinstance(value, str) else str(value)
    raise ValueError(
        f"expected one of {', '.join(RETRY_CONDITIONS)} or an HTTP status 400-599, got {shown}"
    )


RetryCondition = Annotated[str | int, BeforeValidator(_retry_condition)]
DEFAULT_RETRY_ON: tuple[str | int, ...] = ("connect-failure", "reset", 429, 502, 503, 504)


class Backoff(_Section):
    """Exponential back-off with full jitter between attempts (Envoy: retry_back_off)."""

    base: Duration = Field(default=100, ge=1)
    max: Duration = Field(default=2_000, ge=1)


class RetryBudget(_Section):
    """At most `percent` of the route's active requests may be retries at any moment, but
    always `min_concurrency` (Envoy: circuit_breakers retry_budget)."""

    percent: float = Field(default=20.0, ge=0.0, le=100.0)
    min_concurrency: int = Field(default=3, ge=0, le=1_000_000)


class Retries(_Section):
    """When and how Envoy tries a request again (never once a response byte was sent)."""

    # Attempts per request = 1 + max_retries. 0 disables retries.
    max_retries: int = Field(default=2, ge=0, le=10)
    # connect-failure: the connection could not be made (refused, connect timeout);
    # reset: the provider dropped the connection before answering, or an attempt hit the
    #   first_byte / idle timeout (Envoy counts a timed-out attempt as a reset);
    # refused-stream: an HTTP/2 provider refused the stream (always safe);
    # a status (e.g. 429, 503): the provider answered with it.
    retry_on: list[RetryCondition] = Field(default_factory=lambda: list(DEFAULT_RETRY_ON))
    backoff: Backoff = Field(default_factory=Backoff)
    # A 429/503 with `Retry-After: N` (seconds) waits N to 1.5 N seconds instead of the
    # back-off, if N is at most this; longer waits fall back to the back-off, as the
    # retry usually goes to another provider. 0 ignores Retry-After.
    retry_after_max: Duration = Field(default=10_000, ge=0)
    # Send each retry to a provider not yet tried for this request, then to the next
    # priority level (Envoy: previous_hosts and previous_priorities).
    other_provider: bool = True
    budget: RetryBudget = Field(default_factory=RetryBudget)

    @model_validator(mode="after")
    def _no_duplicates(self) -> Retries:
        seen: set[object] = set()
        for condition in self.retry_on:
            if condition in seen:
                raise ValueError(f"retry_on lists {condition!r} twice")
            seen.add(condition)
        return self


# --- outlier detection -------------------------------------------------------------------


class OutlierDetection(_Section):
    """Passive health: eject a provider that keeps failing (Envoy: outlier_detection).

    Each detector is enforced 100% of the time; a count of 0 turns that detector off.
    By default a failure Envoy sees itself (connect failure, reset, attempt timeout)
    counts as a gateway failure (503/504), like a provider's own 502/503/504. Setting
    consecutive_local_origin_failure counts those apart instead (Envoy's
    split_external_local_origin_errors); but Envoy then counts every connection it gets
    to a provider as a success, so a provider that accepts connections and never answers
    is ejected only when several attempts time out with no new one starting in between:
    with one client at a time, never (measured: benchmarks/RESULTS.md, "Provider failures").
    """

    enabled: bool = True
    # Consecutive 5xx answers (500 included), and 429s unless eject_on_429 is false.
    consecutive_5xx: int = Field(default=5, ge=0, le=1_000_000)
    # Consecutive 502/503/504 answers, connect failures, resets and attempt timeouts.
    consecutive_gateway_failure: int = Field(default=3, ge=0, le=1_000_000)
    # null: connection-level failures count as gateway failures (above). A number: count
    # them apart, with this threshold (see the class docstring for the catch).
    consecutive_local_origin_failure: int | None = Field(default=None, ge=0, le=1_000_000)
    # How often ejected providers are reconsidered.
    interval: Duration = Field(default=5_000, ge=1)
    # An ejection lasts base_ejection_time * (times this provider was ejected), capped at
    # max_ejection_time: a provider that keeps failing stays out longer each time.
    base_ejection_time: Duration = Field(default=30_000, ge=1)
    max_ejection_time: Duration = Field(default=300_000, ge=1)
    # Never eject a provider when that would take more than this share of the route's
    # providers out. 50 lets one of two providers be ejected (Envoy's 10 would not).
    max_ejection_percent: int = Field(default=50, ge=0, le=100)
    # Count a provider's 429 answers as failures toward consecutive_5xx: a provider that
    # rate-limits everything is ejected like one that fails (Envoy itself ignores 429).
    eject_on_429: bool = True


# --- active health checks (per provider) -------------------------------------------------

_STATUS_RANGE = re.compile(r"^\s*(\d{3})\s*-\s*(\d{3})\s*$")


def _status_range(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
        return value
    if isinstance(value, str):
        match = _STATUS_RANGE.match(value)
        if match and 100 <= int(match.group(1)) <= int(match.group(2)) <= 599:
            return f"{int(match.group(1))}-{int(match.group(2))}"
    raise ValueError(
        f'expected an HTTP status (e.g. 200) or a range such as "200-499", got {value!r}'
    )


StatusOrRange = Annotated[int | str, BeforeValidator(_status_range)]
DEFAULT_HEALTHY_STATUSES: tuple[int | str, ...] = ("200-499",)


class HealthCheck(_Section):
    """Active HTTP health check of one provider (Envoy: cluster health_checks).

    Health checks bypass the per-attempt filters, so they carry no API key: the default
    path is the provider's `<base_url path>/models` and any answer below 500 (401 from a
    provider that wants a key included) counts as healthy. A provider that fails
    `unhealthy_threshold` checks in a row gets no traffic until it passes
    `healthy_threshold` checks.
    """

    path: str | None = Field(default=None, pattern=r"^/")
    interval: Duration = Field(default=10_000, ge=1)
    timeout: Duration = Field(default=2_000, ge=1)
    unhealthy_threshold: int = Field(default=2, ge=1, le=1000)
    healthy_threshold: int = Field(default=1, ge=1, le=1000)
    expected_statuses: list[StatusOrRange] = Field(
        default_factory=lambda: list(DEFAULT_HEALTHY_STATUSES), min_length=1
    )

    def status_ranges(self) -> list[tuple[int, int]]:
        """Inclusive (low, high) pairs."""
        ranges = []
        for item in self.expected_statuses:
            if isinstance(item, int):
                ranges.append((item, item))
            else:
                low, high = item.split("-")
                ranges.append((int(low), int(high)))
        return ranges


Protocol = Literal["http1", "http2"]


# --- defaults and merging ----------------------------------------------------------------


class Resilience(_Section):
    """The top-level `defaults:` section; each route may override any field of it."""

    pool: Pool = Field(default_factory=Pool)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    retries: Retries = Field(default_factory=Retries)
    outlier_detection: OutlierDetection = Field(default_factory=OutlierDetection)


SECTIONS: tuple[str, ...] = ("pool", "timeouts", "retries", "outlier_detection")


def merge(base: _M, override: _M | None) -> _M:
    """`base` with every field that `override` sets *explicitly* (recursively for sections).

    `routes[].retries: {backoff: {base: 1s}}` keeps the default back-off max and every
    other retry setting.
    """
    if override is None:
        return base
    updates: dict[str, object] = {}
    for name in override.model_fields_set:
        value = getattr(override, name)
        current = getattr(base, name)
        if isinstance(value, BaseModel) and isinstance(current, type(value)):
            value = merge(current, value)
        updates[name] = value
    return base.model_copy(update=updates)


class Overrides(typing.Protocol):  # `Protocol` here is the http1/http2 Literal
    """What `effective` reads of a route (schema.Route): its own resilience sections.

    A protocol rather than schema.Route, so this module does not import schema.py
    (which imports it)."""

    @property
    def pool(self) -> Pool | None: ...
    @property
    def timeouts(self) -> Timeouts | None: ...
    @property
    def retries(self) -> Retries | None: ...
    @property
    def outlier_detection(self) -> OutlierDetection | None: ...


def effective(defaults: Resilience, route: Overrides) -> Resilience:
    """A route's settings: `defaults` overridden by the route's own sections."""
    return Resilience(
        pool=merge(defaults.pool, route.pool),
        timeouts=merge(defaults.timeouts, route.timeouts),
        retries=merge(defaults.retries, route.retries),
        outlier_detection=merge(defaults.outlier_detection, route.outlier_detection),
    )


def set_in(defaults: BaseModel | None, route: BaseModel | None, path: tuple[str, ...]) -> str:
    """Where a merged value came from: "route", "defaults" or "builtin" (for messages)."""
    for origin, model in (("route", route), ("defaults", defaults)):
        current: object = model
        for name in path:
            if not isinstance(current, BaseModel) or name not in current.model_fields_set:
                current = None
                break
            current = getattr(current, name)
        if current is not None:
            return origin
    return "builtin"
