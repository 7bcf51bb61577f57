"""LaneSteering: which lane each `auto` tenant's requests take (docs/fast-lane.md, "The
auto lane").

    steering = LaneSteering(settings, clock)
    steering.load(gateway)            # each config load: the auto tenants and their limits
    steering.on_records(batch)        # LogsService batches of usage notes (notes.py), from
                                      # the ext_proc servers (records.logs_handler)
    moves = steering.tick()           # every tick_s: the tenants that change lanes
    gateway.with_lanes(steering.lanes())   # what the control plane translates and pushes

The rule, per auto tenant, over every limit of its own and of each of its keys, each
counted over its own window from the records of the tenant's requests in both lanes (what
records/billing.py bills: a request, its input and output tokens; a failed request counts
for nothing):
- in the fast lane, it moves to the exact lane as soon as one limit's usage is at least
  `exact_above` (0.5) of the limit: Envoy's token buckets may admit up to about twice a
  limit in a window, the exact lane's sliding windows the limit itself, so a tenant is
  moved with room left for what Envoy admits until the push lands (a record arrives
  after its request ends);
- in the exact lane, it moves back once every limit's usage is at most `fast_below`
  (0.25) of the limit and it has been in the exact lane `hold_s` (10 s): the gap between
  the two thresholds and the hold keep a tenant whose usage hovers near one threshold from
  moving at every tick.
The clock is passed in, so tests run it by hand.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from sluicegate import config, wire
from sluicegate.model import Gateway
from sluicegate.records import RequestRecord, fields_of, log_name

from .notes import UsageNote, note_from_fields, note_of
from .usage import Entry, UsageLog

# A refusal-made move's hold doubles per such move in a row, up to 2**MAX_BACKOFF times.
MAX_BACKOFF: Final = 5
# Requests counted while running whose end is awaited; more are forgotten oldest first
# (an end lost with its Envoy): their estimate then stays counted.
MAX_RUNNING: Final = 100_000


@dataclass(frozen=True, slots=True)
class _Running:
    """A request counted while it runs: where its estimate went, to adjust at its end."""

    charges: tuple[tuple[UsageLog, Entry], ...]
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class AutoLaneSettings:
    """When an `auto` tenant changes lanes (module docstring). Fractions are of a limit,
    over its window; the control plane calls `tick` every `tick_s`."""

    exact_above: float = 0.5
    fast_below: float = 0.25
    hold_s: float = 10.0
    tick_s: float = 0.1

    def __post_init__(self) -> None:
        if not all(
            math.isfinite(value)
            for value in (self.exact_above, self.fast_below, self.hold_s, self.tick_s)
        ):
            raise ValueError("auto lane settings must be finite numbers")
        if not 0 < self.fast_below < self.exact_above <= 1:
            raise ValueError(
                "auto lane settings need 0 < fast_below < exact_above <= 1, got "
                f"fast_below {self.fast_below}, exact_above {self.exact_above}"
            )
        if self.hold_s < 0:
            raise ValueError(f"auto lane hold_s must be at least 0, got {self.hold_s}")
        if self.tick_s <= 0:
            raise ValueError(f"auto lane tick_s must be positive, got {self.tick_s}")


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """One limit of an auto tenant (its own: `key` None; else that key's) and what its
    window holds now."""

    key: str | None
    kind: config.LimitKind
    limit: int
    window_s: float
    used: int

    @property
    def fraction(self) -> float:
        return self.used / self.limit

    def describe(self) -> str:
        """e.g. `key ci's tokens 5200/10000 per 60s (52%)`: names only, never a key."""
        owner = "its" if self.key is None else f"key {self.key}'s"
        return (
            f"{owner} {self.kind} {self.used}/{self.limit} per {self.window_s:g}s "
            f"({self.fraction:.0%})"
        )


@dataclass(frozen=True, slots=True)
class LaneMove:
    """One auto tenant moved between lanes, and why: the limit whose usage crossed
    `threshold` (for a move to the fast lane, the fullest limit, at most the threshold;
    None when the tenant has no limit left)."""

    tenant: str
    from_lane: config.Lane
    to_lane: config.Lane
    limit: LimitUsage | None
    threshold: float
    # Moved because the fast lane's buckets refused it (they charge a request's estimate,
    # which may run far above what it is billed).
    refused: bool = False

    def describe(self) -> str:
        """The one log line of this move."""
        if self.refused:
            why = "the fast lane's token buckets refused a request"
        elif self.limit is None:
            why = "no limits left"
        else:
            side = ">=" if self.to_lane == config.LANE_EXACT else "<="
            why = f"{self.limit.describe()} {side} {self.threshold:.0%}"
        return f"tenant {self.tenant}: auto lane {self.from_lane} -> {self.to_lane}: {why}"


@dataclass(frozen=True, slots=True)
class TenantLane:
    """One auto tenant, as /status and /metrics show it."""

    lane: config.Lane
    since_s: float  # in that lane, seconds
    limits: tuple[LimitUsage, ...]
    moves: int  # since it became auto (a reload keeps the count)


@dataclass(slots=True)
class _Scope:
    """One set of rate limits (the tenant's own, or one key's) and the usage log they
    share (one window: the set's `per`)."""

    limits: tuple[config.Limit, ...]
    log: UsageLog

    @classmethod
    def of(cls, rate_limits: config.RateLimits | None, before: _Scope | None) -> _Scope | None:
        limits = () if rate_limits is None else tuple(rate_limits.limits())
        if not limits:
            return None
        window_s = limits[0].window_ms / 1000
        if before is None:
            return cls(limits, UsageLog(window_s))
        before.log.set_window(window_s)  # a changed limit keeps the usage already counted
        return cls(limits, before.log)

    def usages(self, key: str | None, now: float) -> list[LimitUsage]:
        usage = self.log.usage(now)
        return [
            LimitUsage(key, limit.kind, limit.limit, self.log.window_s, usage.of(limit.kind))
            for limit in self.limits
        ]


@dataclass(slots=True)
class _TenantState:
    lane: config.Lane
    since: float  # the clock's time it entered `lane`
    own: _Scope | None
    keys: dict[str, _Scope] = field(default_factory=dict)
    moves: int = 0
    # The fast lane's buckets refused one of its requests since it last moved.
    refused: bool = False
    # Moves to the exact lane by a refusal in a row: each doubles the hold before the
    # tenant may return (up to MAX_BACKOFF), so one whose estimates outgrow its buckets
    # does not flap every hold; forgotten after a longest window in the fast lane unrefused.
    refusals: int = 0

    def longest_window_s(self) -> float:
        scopes = [scope for scope in (self.own, *self.keys.values()) if scope is not None]
        return max((scope.log.window_s for scope in scopes), default=0.0)

    def usages(self, now: float) -> list[LimitUsage]:
        usages = [] if self.own is None else self.own.usages(None, now)
        for name, scope in self.keys.items():
            usages.extend(scope.usages(name, now))
        return usages


@dataclass(frozen=True, slots=True)
class SavedLanes:
    """The steering's state, kept across a load the control plane may reject."""

    tenants: dict[str, _TenantState]
    running: OrderedDict[tuple[str, str], _Running]
    settings: AutoLaneSettings
    windows: dict[int, float]  # a usage log's id -> its window before the load


class LaneSteering:
    """The current lane of every `auto` tenant, from its requests' records (module
    docstring; docs/fast-lane.md, "The auto lane")."""

    def __init__(
        self,
        settings: AutoLaneSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or AutoLaneSettings()
        self._clock = clock
        self._tenants: dict[str, _TenantState] = {}
        # (tenant, stream id) -> a running request's charges (its records while it runs).
        self._running: OrderedDict[tuple[str, str], _Running] = OrderedDict()
        # Requests whose end was counted, the latest MAX_RUNNING: a late running note of
        # one counts nothing.
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.records_counted = 0

    # ----- config --------------------------------------------------------------------------

    def load(self, gateway: Gateway) -> None:
        """Adopt a config load: its thresholds (`admission.auto_lane`), its auto tenants
        and their limits. A tenant still auto keeps its lane and the usage counted (a
        changed limit reads it over its new window); a new one starts in the fast lane;
        one no longer auto is forgotten."""
        declared = gateway.admission.auto_lane
        self.settings = replace(
            self.settings,
            exact_above=declared.exact_above,
            fast_below=declared.fast_below,
            hold_s=declared.hold / 1000,
        )
        now = self._clock()
        old = self._tenants
        self._tenants = {}
        for tenant in gateway.tenants:
            if not tenant.auto:
                continue
            before = old.get(tenant.name)
            state = _TenantState(
                lane=config.LANE_FAST if before is None else before.lane,
                since=now if before is None else before.since,
                own=_Scope.of(tenant.rate_limits, None if before is None else before.own),
                moves=0 if before is None else before.moves,
                refused=False if before is None else before.refused,
                refusals=0 if before is None else before.refusals,
            )
            for key in tenant.keys:
                scope = _Scope.of(
                    key.rate_limits, None if before is None else before.keys.get(key.name)
                )
                if scope is not None:
                    state.keys[key.name] = scope
            self._tenants[tenant.name] = state

    def saved(self) -> SavedLanes:
        """What `restore` puts back: the state before a load that may be rejected."""
        windows = {
            id(scope.log): scope.log.window_s
            for state in self._tenants.values()
            for scope in (state.own, *state.keys.values())
            if scope is not None
        }
        return SavedLanes(dict(self._tenants), OrderedDict(self._running), self.settings, windows)

    def restore(self, saved: SavedLanes) -> None:
        """Back to the state `saved` returned (the control plane's load was rejected: the
        last good config, with its tenants' lanes and counts, stays in force)."""
        self._tenants, self._running = saved.tenants, saved.running
        self.settings = saved.settings
        for state in self._tenants.values():
            for scope in (state.own, *state.keys.values()):
                if scope is not None and id(scope.log) in saved.windows:
                    scope.log.set_window(saved.windows[id(scope.log)])

    # ----- records -------------------------------------------------------------------------

    def on_records(self, batch: Sequence[Any]) -> int:
        """Some OpenTelemetry LogRecords of a LogsService batch (records.RecordBatches):
        the usage notes' alone (wire.LANE_USAGE_LOG_NAME, from the ext_proc servers)."""
        counted = 0
        for log_record in batch:
            if log_name(log_record) == wire.LANE_USAGE_LOG_NAME:
                note = note_from_fields(fields_of(log_record))
                counted += note is not None and self.count(note)
        return counted

    def observe(self, record: RequestRecord) -> bool:
        """Count one request record (`count` of its note: notes.note_of)."""
        note = note_of(record)
        return note is not None and self.count(note)

    def count(self, note: UsageNote) -> bool:
        """Count one note into its auto tenant's limits (its own, and its key's) at the
        clock's now; False for another tenant's, a failed request's (billed nothing, not
        even a request), a running request's already counted, or a tenant without
        limits."""
        state = self._tenants.get(note.tenant)
        if state is None:
            return False
        scopes = [state.own, state.keys.get(note.key_name) if note.key_name else None]
        logs = [scope.log for scope in scopes if scope is not None]
        if not logs:
            return False
        if note.running:
            return self._running_request(note, logs)
        if note.kind == "refused" and state.lane == config.LANE_FAST:
            state.refused = True  # the exact lane admits it by what it is billed
        stream = (note.tenant, note.stream_id)
        running = self._running.pop(stream, None) if note.stream_id else None
        if note.stream_id:
            # Its running notes come by another logger than its end (record_log.py): one
            # that arrives after the end counts nothing.
            self._ended[stream] = None
            if len(self._ended) > MAX_RUNNING:
                self._ended.popitem(last=False)
        if running is not None:
            # Counted while it ran: its estimate becomes what it was billed, in place.
            for log, entry in running.charges:
                log.adjust(
                    entry,
                    -1 if note.failed else 0,
                    note.input_tokens - running.input_tokens,
                    note.output_tokens - running.output_tokens,
                )
            return True
        if note.failed:
            return False
        now = self._clock()
        for log in logs:
            log.add(now, 1, note.input_tokens, note.output_tokens)
        self.records_counted += 1
        return True

    def _running_request(self, note: UsageNote, logs: list[UsageLog]) -> bool:
        """A request's note sent while it runs (docs/fast-lane.md, "The auto lane"): its
        first counts its estimate now, so a long request is seen long before its end."""
        stream = (note.tenant, note.stream_id)
        if not note.stream_id or stream in self._running or stream in self._ended:
            return False  # counted already (Envoy sends one every IN_FLIGHT_FLUSH_MS)
        now = self._clock()
        charges = tuple(
            (log, log.add(now, 1, note.input_tokens, note.output_tokens)) for log in logs
        )
        self._running[stream] = _Running(charges, note.input_tokens, note.output_tokens)
        if len(self._running) > MAX_RUNNING:
            self._running.popitem(last=False)
        self.records_counted += 1
        return True

    # ----- steering ------------------------------------------------------------------------

    def tick(self) -> list[LaneMove]:
        """Move the tenants whose usage says so (module docstring); the moves made."""
        now = self._clock()
        settings = self.settings
        moves = []
        for name, state in self._tenants.items():
            fullest = max(state.usages(now), key=lambda usage: usage.fraction, default=None)
            fraction = 0.0 if fullest is None else fullest.fraction
            calm = state.lane == config.LANE_FAST and not state.refused
            if calm and state.refusals and now - state.since >= state.longest_window_s():
                state.refusals = 0
            hold_s = settings.hold_s * 2 ** min(state.refusals, MAX_BACKOFF)
            if state.lane == config.LANE_FAST and (
                fraction >= settings.exact_above or state.refused
            ):
                to_lane: config.Lane = config.LANE_EXACT
                threshold = settings.exact_above
            elif (
                state.lane == config.LANE_EXACT
                and fraction <= settings.fast_below
                and now - state.since >= hold_s
            ):
                to_lane, threshold = config.LANE_FAST, settings.fast_below
            else:
                continue
            refused = state.refused and fraction < settings.exact_above
            if refused:
                state.refusals += 1
            moves.append(LaneMove(name, state.lane, to_lane, fullest, threshold, refused))
            state.lane, state.since, state.refused = to_lane, now, False
            state.moves += 1
        return moves

    def lanes(self) -> dict[str, config.Lane]:
        """Every auto tenant's current lane (Gateway.with_lanes)."""
        return {name: state.lane for name, state in self._tenants.items()}

    # ----- observability -------------------------------------------------------------------

    def report(self) -> dict[str, TenantLane]:
        """Every auto tenant: its lane, for how long, each limit's usage, its moves."""
        now = self._clock()
        return {
            name: TenantLane(
                lane=state.lane,
                since_s=max(0.0, now - state.since),
                limits=tuple(state.usages(now)),
                moves=state.moves,
            )
            for name, state in self._tenants.items()
        }
