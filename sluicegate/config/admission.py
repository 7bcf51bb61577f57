"""Who may call, how much, and how urgently: tenants, client keys, limits, priority.

The shape of docs/architecture.md, "Token-aware admission":

- `tenants:` lists who may call. Each tenant has client keys (stored as salted
  hashes, keyhash.py), optional rate limits of its own and per key, the models it
  may use, and the highest priority class it may ask for.
- `admission:` holds what is shared: the priority classes (highest first), token
  estimates, and where the limiters keep their counters (memory or Redis).
- A route may add per-model rate limits, its own token estimate, and a
  `concurrency` gate whose queue is ordered by priority class.

Rules spanning sections (declared classes, served models, unique keys) live in
validate.py. This module imports nothing from schema.py because schema.py imports it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Final, Literal, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from sluicegate.wire import ANONYMOUS_TENANT, RESERVED_LABEL_VALUES

from .durations import Duration
from .key_source import KeySource
from .keyhash import parse_key_hash

# A DNS-label-like identifier (listeners, providers, routes, tenants, keys, classes).
# It is defined here, not in schema.py, because schema.py imports this module.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"

LimitKind = Literal["requests", "tokens", "input_tokens", "output_tokens"]
LIMIT_KINDS: tuple[LimitKind, ...] = ("requests", "tokens", "input_tokens", "output_tokens")
_MAX_LIMIT = 1_000_000_000_000  # counters stay exact in Redis Lua (doubles)
_MAX_TOKENS = 100_000_000


_LABELS_OWN: Final = "the metric labels of a name the config does not declare and of a missing one"


def check_label_name(
    name: str, reserved: tuple[str, ...] = RESERVED_LABEL_VALUES, why: str = _LABELS_OWN
) -> str:
    """A name that is a metric label's value (a provider, model, tenant, priority class or
    scenario; records/labels.py) must not be one of the values the labels give otherwise
    (`reserved`, `why`; wire.RESERVED_LABEL_VALUES): its series would merge with theirs."""
    if name in reserved:
        names = ", ".join(repr(value) for value in reserved)
        raise ValueError(
            f"{name!r} is reserved ({why}), so its series would merge with theirs: choose "
            f"another name (not {names})"
        )
    return name


def check_model_names(models: list[str]) -> list[str]:
    """A model name is sent to Envoy in a request header (wire.MODEL_HEADER) and matched
    there: it must not be empty or hold a control character, nor a backslash (which a
    JSON body escapes: docs/fast-lane.md); it is a label's value too (check_label_name)."""
    if any(not model.strip() for model in models):
        raise ValueError("model names must not be empty")
    for model in models:
        check_label_name(model)
        if any(ord(char) < 0x20 or ord(char) == 0x7F for char in model):
            raise ValueError(
                f"model name {model!r} holds a control character, which an HTTP header cannot carry"
            )
        if "\\" in model:
            # A body writes it escaped, and Envoy's model reader matches names as written.
            raise ValueError(f"model name {model!r} holds a backslash")
    return models


class _Section(BaseModel):
    """Unknown keys are errors, values are not coerced across types (as in schema.Strict)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Limit(NamedTuple):
    """One limit that is set: at most `limit` of `kind` per `window_ms`."""

    kind: LimitKind
    limit: int
    window_ms: int


class RateLimits(_Section):
    """Limits over one window; a field left out (or null) is not limited."""

    # Requests started per window.
    requests: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    # Input plus output tokens per window (reserved up front, reconciled at the end).
    tokens: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    # Prompt tokens per window.
    input_tokens: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    # Completion tokens per window.
    output_tokens: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    # The window every limit above is counted over.
    per: Duration = Field(default=60_000, ge=1)

    def limits(self) -> list[Limit]:
        """The limits that are set, in LIMIT_KINDS order (empty: nothing is limited)."""
        return [
            Limit(kind, value, self.per)
            for kind in LIMIT_KINDS
            if (value := getattr(self, kind)) is not None
        ]

    def fits_token_buckets(self) -> bool:
        """Whether Envoy's token buckets can hold these limits (the fast lane's): a window
        of at least FAST_LANE_MIN_FILL_MS, each limit at most FAST_LANE_MAX_LIMIT."""
        return self.per >= FAST_LANE_MIN_FILL_MS and all(
            limit.limit <= FAST_LANE_MAX_LIMIT for limit in self.limits()
        )


class PriorityClass(_Section):
    """One priority class with its own bounded queue."""

    name: str = Field(pattern=NAME_PATTERN)

    @field_validator("name")
    @classmethod
    def _not_a_label_of_its_own(cls, value: str) -> str:
        # The routing stage's class of a request refused before its class was known is
        # `none` (wire.NO_PRIORITY_CLASS), one of the reserved values.
        return check_label_name(value)

    # Requests of this class that may wait at one gate; more are shed with a 429/503.
    max_queue: int = Field(ge=0, le=1_000_000)
    # Longest wait in the queue before the request is shed.
    max_wait: Duration = Field(ge=0)

    @property
    def queue_room(self) -> int:
        """How many of it may wait at a gate: `max_queue`, none when `max_wait` is 0."""
        return self.max_queue if self.max_wait > 0 else 0


def _default_classes() -> list[PriorityClass]:
    # Written as in YAML: a Duration field reads "10s", and would refuse a bare 10000.
    return [
        PriorityClass.model_validate({"name": "interactive", "max_queue": 64, "max_wait": "10s"}),
        PriorityClass.model_validate({"name": "standard", "max_queue": 128, "max_wait": "30s"}),
        PriorityClass.model_validate({"name": "batch", "max_queue": 256, "max_wait": "60s"}),
    ]


StoreKind = Literal["memory", "redis"]
OnFailure = Literal["fail_open", "fail_closed", "local"]
# How requests are decided (docs/fast-lane.md): `exact` by the routing stage, in Python;
# `fast` by Envoy alone (keys, tenants' limits as token buckets, routing); `auto` in the
# fast lane while far from its limits, moved to the exact lane near them by the control
# plane ("The auto lane").
Lane = Literal["exact", "fast", "auto"]
LANE_FAST: Final = "fast"
LANE_EXACT: Final = "exact"
LANE_AUTO: Final = "auto"
# A fast-lane token bucket refills at most this often (Envoy refuses under 50 ms), so a
# Retry-After is whole seconds; a fast-lane limit's window is at least this long.
FAST_LANE_MIN_FILL_MS: Final = 1000
# An Envoy token bucket's size is a uint32.
FAST_LANE_MAX_LIMIT: Final = 2**32 - 1
REDIS_SCHEMES = ("redis", "rediss", "unix")


class LimiterStoreConfig(_Section):
    """Where rate-limit counters live: this process's memory, or Redis shared by replicas."""

    kind: StoreKind = "memory"
    # redis://host:port/db, rediss:// (TLS) or unix:///path; only with kind: redis.
    url: str | None = None
    # Prefix of every Redis key, used as the Cluster hash tag `{prefix}` so one Lua
    # script can touch all of a request's counters (one slot).
    key_prefix: str = Field(default="sluicegate", pattern=r"^[A-Za-z0-9._:-]{1,64}$")
    # Per Redis call; past it the call counts as a Redis failure.
    timeout: Duration = Field(default=100, ge=1)
    # When Redis fails: admit everything, refuse everything (503), or limit locally.
    on_failure: OnFailure = "local"
    # ext_proc replicas sharing this Redis; the local fallback enforces limit / replicas.
    replicas: int = Field(default=1, ge=1, le=10_000)

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        # Never echo the URL: it may carry a password.
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in REDIS_SCHEMES:
            raise ValueError("url must start with redis://, rediss:// or unix://")
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError("a unix:// url needs a socket path, e.g. unix:///run/redis.sock")
        elif not parts.hostname:
            raise ValueError("url has no host, e.g. redis://127.0.0.1:6379/0")
        try:
            _ = parts.port
        except ValueError:
            raise ValueError("url has a bad port") from None
        return value


class AutoLane(_Section):
    """When the control plane moves an `auto` tenant between lanes (docs/fast-lane.md,
    "The auto lane"): to the exact lane once its usage of any of its (or its keys')
    limits reaches `exact_above` of the limit in the limit's window; back to the fast lane
    once every usage is at most `fast_below` and it has been in the exact lane `hold`."""

    exact_above: float = Field(default=0.5, gt=0.0, le=1.0)
    fast_below: float = Field(default=0.25, gt=0.0, lt=1.0)
    hold: Duration = Field(default=10_000, ge=0)

    def bucket_size(self, limit: int) -> int:
        """An auto tenant's fast-lane bucket for `limit`: the limit less `fast_below` of it,
        rounded down (in exact fractions: 90 less 0.3 is 63), at least 1. It comes back to
        the fast lane with up to that share of a window used (docs/fast-lane.md)."""
        return max(1, math.floor(limit * (1 - Fraction(str(self.fast_below)))))

    @model_validator(mode="after")
    def _ordered(self) -> AutoLane:
        if self.fast_below >= self.exact_above:
            raise ValueError(
                f"fast_below ({self.fast_below}) must be below exact_above "
                f"({self.exact_above}), or a tenant would move back and forth"
            )
        return self


class Admission(_Section):
    """The top-level `admission:` section: priority classes, token estimates, limiter store."""

    # Highest first: a queue serves a class only when every higher class's queue is empty.
    priority_classes: list[PriorityClass] = Field(
        default_factory=_default_classes, min_length=1, max_length=16
    )
    # The class of a tenant that names none.
    default_priority: str = "standard"
    # Bound over all classes' queues of one gate; null: only the per-class bounds.
    max_queued: int | None = Field(default=None, ge=1, le=10_000_000)
    # Output-token estimate for a request without max_tokens (reserved, then reconciled).
    default_max_tokens: int = Field(default=1024, ge=1, le=_MAX_TOKENS)
    # A request asking for more output tokens than this is refused with a 400.
    max_output_tokens: int = Field(default=1_000_000, ge=1, le=_MAX_TOKENS)
    store: LimiterStoreConfig = Field(default_factory=LimiterStoreConfig)
    # Who decides each request: the routing stage (`exact`), Envoy alone (`fast`), or
    # Envoy while a tenant is far from its limits (`auto`); a tenant may name its own.
    # Left out: `auto` where that changes no limit, gate or key declared, else `exact`
    # (lane_rules.py), set when the whole document is read; never None after that.
    lane: Lane | None = None
    # When `auto` tenants move between lanes.
    auto_lane: AutoLane = Field(default_factory=AutoLane)
    # Why `lane` is what it is when the YAML left it out (lane_rules.with_default_lane);
    # empty when it was written.
    _lane_default: str = PrivateAttr(default="")

    @property
    def lane_defaulted(self) -> str:
        """Why `lane` took its default (lane_rules.py), or "" when the YAML wrote it."""
        return self._lane_default

    @property
    def class_names(self) -> tuple[str, ...]:
        """Names of the priority classes, highest first."""
        return tuple(item.name for item in self.priority_classes)

    def priority_of(self, tenant: Tenant) -> str:
        """The class a tenant's requests get unless they ask for a lower one."""
        return tenant.priority or self.default_priority

    @property
    def gateway_lane(self) -> Lane:
        """`lane`, written or defaulted (`exact` only for a section never resolved,
        which no loaded config has)."""
        return self.lane or LANE_EXACT

    def lane_of(self, tenant: Tenant) -> Lane:
        """The lane a tenant's requests take: its own, else this section's."""
        return tenant.lane or self.gateway_lane

    def lane_written(self, tenant: Tenant) -> bool:
        """Whether the YAML chose `tenant`'s lane (its own, or admission.lane)."""
        return tenant.lane is not None or not self._lane_default

    def lanes_at_gate(self, tenants: Sequence[Tenant], models: Iterable[str]) -> frozenset[Lane]:
        """Which lanes' requests reach the gate of a route serving `models`: `fast` for a
        `fast` tenant allowed one of them (without tenants: any lane but `exact`), `exact`
        for an exact-lane or `auto` tenant allowed one (an `auto` tenant's requests for a
        gated model take the exact lane). One lane enforces a gate: Envoy when only `fast`
        reaches it, else the routing stage (docs/fast-lane.md, "Gates in the fast
        lane")."""
        if not tenants:
            return frozenset({LANE_EXACT if self.gateway_lane == LANE_EXACT else LANE_FAST})
        return frozenset(
            LANE_FAST if self.lane_of(tenant) == LANE_FAST else LANE_EXACT
            for tenant in self.tenants_of(tenants, models)
        )

    def gate_is_envoys(self, tenants: Sequence[Tenant], models: Iterable[str]) -> bool:
        """Whether Envoy enforces the gate of a route serving `models` (`lanes_at_gate`)."""
        return self.lanes_at_gate(tenants, models) == {LANE_FAST}

    def bucket_refuses_uncapped(self, limit: Limit) -> bool:
        """Whether an `auto` tenant's fast-lane bucket for a token `limit` is smaller than
        the allowance of a request without an output cap, so every such request is refused
        there (and moves the tenant to the exact lane)."""
        return (
            limit.kind in ("tokens", "output_tokens")
            and self.auto_lane.bucket_size(limit.limit) < self.default_max_tokens
        )

    def tenants_of(self, tenants: Sequence[Tenant], models: Iterable[str]) -> list[Tenant]:
        """The tenants allowed one of `models` (a route's)."""
        served = set(models)
        return [t for t in tenants if t.models is None or served & set(t.models)]

    def _section_lane_why(self) -> str:
        return f"the default: {self._lane_default}" if self._lane_default else "admission.lane"

    def describe_gateway_lane(self) -> str:
        """For `sluicegate validate` without tenants: who routes requests, and why."""
        why = self._section_lane_why()
        does = (
            "the routing stage routes every request"
            if self.gateway_lane == LANE_EXACT
            else "Envoy routes every request (no routing-stage stream)"
        )
        return f"requests: lane {self.gateway_lane} ({why}): {does}"

    def describe_lane(self, tenant: Tenant) -> str:
        """Which lane a tenant takes and why, for `sluicegate validate`."""
        lane = self.lane_of(tenant)
        why = "its own lane" if tenant.lane is not None else self._section_lane_why()
        does = {
            LANE_FAST: "Envoy checks its keys and limits it with token buckets",
            LANE_EXACT: "the routing stage admits it (sliding windows, queues)",
            LANE_AUTO: (
                "Envoy decides its requests while it is far from its limits; the control "
                "plane moves it to the routing stage's sliding windows when its usage nears "
                "them, and back"
            ),
        }[lane]
        return f"tenant {tenant.name}: lane {lane} ({why}): {does}"


class ClientKey(_Section):
    """One API key of a tenant, stored only as its hash."""

    # Shown in metrics and logs instead of the key; unique across all tenants.
    name: str = Field(pattern=NAME_PATTERN)
    # `sha256:<salt hex>:<digest hex>`, printed by `sluicegate hash-key`.
    hash: str
    # Limits for this key alone, on top of its tenant's.
    rate_limits: RateLimits | None = None
    # The key itself, from an environment variable or a file, for Envoy to check in the
    # fast lane (docs/fast-lane.md, "Keys"); it must match `hash`.
    secret: KeySource | None = None

    @field_validator("hash")
    @classmethod
    def _hash_form(cls, value: str) -> str:
        parse_key_hash(value)  # raises ValueError with the reason, never echoing the value
        return value


class Tenant(_Section):
    """A team or application: its keys, limits, models and priority."""

    name: str = Field(pattern=NAME_PATTERN)
    # Highest class the tenant may use, and its default; null: admission.default_priority.
    priority: str | None = None
    # Models it may call; null: every model a route serves.
    models: list[str] | None = Field(default=None, min_length=1)
    # Limits over all of the tenant's keys together.
    rate_limits: RateLimits | None = None
    keys: list[ClientKey] = Field(default_factory=list)
    # Who decides its requests (docs/fast-lane.md); null: admission.lane.
    lane: Lane | None = None

    @field_validator("models")
    @classmethod
    def _non_empty_models(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else check_model_names(value)

    @field_validator("name")
    @classmethod
    def _not_a_label_of_its_own(cls, value: str) -> str:
        return check_label_name(
            value,
            (*RESERVED_LABEL_VALUES, ANONYMOUS_TENANT),
            "the metric labels of an undeclared and of a missing tenant, and of requests "
            "without a key or whose key was refused",
        )


def lower_class_share(capacity: int, headroom: float) -> int:
    """What the classes below the top one may hold of a gate's `capacity`: the share
    `headroom` leaves them, rounded down, but at least 1 (a gate of 4 with headroom 0.25
    keeps 1 for the top class). The routing stage's queues and Envoy's gate both use it."""
    # The slack absorbs binary float error: 10 * (1 - 0.9) is 0.9999999999999998.
    return max(1, math.floor(capacity * (1.0 - headroom) + 1e-9))


class Concurrency(_Section):
    """A route's in-flight gate; requests beyond it wait in the priority queues."""

    # Requests in flight at once.
    max_requests: int | None = Field(default=None, ge=1, le=1_000_000)
    # Estimated tokens (prompt + max_tokens) in flight at once.
    max_tokens: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    # Share of the gate that only the top priority class may use, kept free for it.
    headroom: float = Field(default=0.25, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _some_limit(self) -> Concurrency:
        if self.max_requests is None and self.max_tokens is None:
            raise ValueError("give max_requests, max_tokens or both")
        return self
