"""The limiter's vocabulary: limits, usage, decisions, and the store protocol.

Both stores (in-process and Redis) speak these types, so the filter that
admits requests and writes `x-ratelimit-*` headers never knows which one runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol, get_args

Kind = Literal["requests", "input_tokens", "output_tokens", "tokens"]
"""What a limit counts; `tokens` is input + output."""

KINDS: Final[frozenset[str]] = frozenset(get_args(Kind))

StoreMode = Literal["ok", "fail_open", "fail_closed", "local"]
OnFailure = Literal["fail_open", "fail_closed", "local"]

# A scope ends up inside store keys (`scope:name:kind:window_ms`): it must not
# contain the separator, and no hash-tag braces (Redis Cluster slots by them).
_SCOPE_FORBIDDEN: Final = frozenset(":{}")


class StoreUnavailable(Exception):
    """The shared store did not answer (connection refused, timeout, error reply).

    Callers (FailoverStore) catch this one type instead of the client's errors.
    """


class StoreBusy(StoreUnavailable):
    """This process had no free connection to the store in time: a local overload, not
    a sign that Redis is down (FailoverStore decides that one request by its fallback
    and keeps counting in Redis)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Limit:
    """At most `limit` units of `kind` in ANY interval of `window_s` seconds."""

    scope: str
    name: str
    kind: Kind
    limit: int
    window_s: float
    # The counter id (`key`), made once: stores read it on every decision.
    _key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.scope or _SCOPE_FORBIDDEN & set(self.scope):
            raise ValueError(f"scope must be non-empty without ':{{}}', got {self.scope!r}")
        if not self.name:
            raise ValueError("name must be non-empty")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if not _is_int(self.limit) or self.limit <= 0:
            raise ValueError(f"limit must be an int > 0, got {self.limit!r}")
        if not math.isfinite(self.window_s) or self.window_ms < 1:
            raise ValueError(f"window_s must be at least 0.001, got {self.window_s!r}")
        key = f"{self.scope}:{self.name}:{self.kind}:{self.window_ms}"
        object.__setattr__(self, "_key", key)

    @property
    def window_ms(self) -> int:
        """The window as whole milliseconds: the unit both stores count in."""
        return round(self.window_s * 1000)

    @property
    def key(self) -> str:
        """Stable counter id. The limit value is not part of it, so a config
        change that raises or lowers a limit keeps the charges already made.
        Unambiguous even when `name` holds ':' (scope, kind and window have none)."""
        return self._key


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one request: estimated at admission, real after the response."""

    input_tokens: int
    output_tokens: int
    # 1 for a request; 0 only when reconciling one the gateway itself turned away (shed
    # from a queue, cancelled while waiting): it must not use up the tenant's requests;
    # more in one charge of several requests (the fast lane's, charged per batch).
    requests: int = 1

    def __post_init__(self) -> None:
        if not _is_int(self.input_tokens) or self.input_tokens < 0:
            raise ValueError(f"input_tokens must be an int >= 0, got {self.input_tokens!r}")
        if not _is_int(self.output_tokens) or self.output_tokens < 0:
            raise ValueError(f"output_tokens must be an int >= 0, got {self.output_tokens!r}")
        if not _is_int(self.requests) or self.requests < 0:
            raise ValueError(f"requests must be an int >= 0, got {self.requests!r}")

    def amount(self, kind: Kind) -> int:
        """Units this usage charges on a limit of `kind`."""
        if kind == "requests":
            return self.requests
        if kind == "input_tokens":
            return self.input_tokens
        if kind == "output_tokens":
            return self.output_tokens
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class LimitState:
    """One limit after a decision; feeds the `x-ratelimit-*` headers."""

    limit: Limit
    used: int
    remaining: int
    reset_s: float  # until the window holds no charge at all (OpenAI's meaning)


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one reserve call.

    `states` has one entry per limit in the order given, except when the store
    could not count (fail_open, fail_closed): then it is empty, because any
    number in a header would be made up.
    """

    admitted: bool
    reservation_id: str
    states: tuple[LimitState, ...]
    refused_by: Limit | None
    requested: int
    retry_after_s: float | None
    too_large: bool
    store_mode: StoreMode


class LimiterStore(Protocol):
    """Reserve before forwarding a request, reconcile when its usage is known; charge a
    request admitted elsewhere."""

    async def reserve(
        self, reservation_id: str, limits: Sequence[Limit], estimate: Usage
    ) -> Decision: ...

    async def reconcile(self, reservation_id: str, actual: Usage) -> bool: ...

    async def charge(self, charge_id: str, limits: Sequence[Limit], usage: Usage) -> bool:
        """Count `usage` on every limit now, whatever the windows hold: a request another
        lane already admitted (an `auto` tenant's fast-lane request, counted into its
        exact-lane windows), so a window may go over its limit. Never refused. False when
        nothing was counted (FailoverStore while Redis is down, unless it counts locally).

        A charge keeps a record as `reserve` does (until the longest window ends), so
        `reconcile(charge_id, actual)` replaces `usage` in place, at the charge's time (a
        request still running, charged its estimate), and the id stays in use: a second
        charge of it, whatever its amount, raises DuplicateReservation and writes nothing."""
        ...

    async def close(self) -> None: ...


class StoreObserver(Protocol):
    """Metrics hooks; `op` is "reserve", "reconcile" or "charge", `state` "up" or "down".
    `charge_dropped`: a charge counted nowhere (FailoverStore while Redis is down)."""

    def store_latency(self, op: str, seconds: float) -> None: ...

    def store_failure(self, op: str) -> None: ...

    def store_state(self, state: str) -> None: ...

    def charge_dropped(self) -> None: ...


def check_request(reservation_id: str, limits: Sequence[Limit]) -> None:
    """Reject what both stores would otherwise mishandle: an empty id, and two
    limits sharing one counter (they would charge the same log twice)."""
    if not isinstance(reservation_id, str) or not reservation_id:
        raise ValueError("reservation_id must be a non-empty str")
    keys = [limit.key for limit in limits]
    if len(set(keys)) != len(keys):
        raise ValueError(f"two limits share one counter key: {keys}")


class DuplicateReservation(ValueError):
    """A reservation or charge id was reused while its record or charge still lives: a
    caller bug for a reservation (ids must be unique, e.g. uuid4); for a charge, the
    sign that it was made already (a stream's second in-flight record)."""
