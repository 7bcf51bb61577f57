"""In-process limiter store: one sluicegate replica, tests, and the local fallback.

Same algorithm and answers as the Redis store (scripts.py), in Python. One event
loop and no await inside a decision, so no lock is needed.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from .decision import RETRY_WALK_CAP, US_PER_S, make_decision
from .model import Decision, DuplicateReservation, Kind, Limit, Usage, check_request


class _Log:
    """Sliding-window log of one limit key.

    Rule "exact sliding window": a charge made at t counts while now < t + window,
    so any interval of one window holds at most the limit. `total` is the running
    sum of the charges in `charges`, so a decision costs O(1) amortised: each
    charge is added once and pruned once.
    """

    __slots__ = ("charges", "total", "window_us")

    def __init__(self, window_us: int) -> None:
        self.window_us = window_us
        # reservation id -> (decision time µs, amount), oldest first. Zero charges
        # are not kept (they would make reset_s report a charge that is not there).
        self.charges: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.total = 0

    def prune(self, now_us: int) -> None:
        cutoff = now_us - self.window_us
        charges = self.charges
        while charges:
            t, amount = next(iter(charges.values()))
            if t > cutoff:
                break
            charges.popitem(last=False)
            self.total -= amount

    def add(self, rid: str, t: int, amount: int) -> None:
        """Append a charge; t is never older than the newest one (monotonic clock)."""
        if amount > 0:
            self.charges[rid] = (t, amount)
            self.total += amount

    def replace(self, rid: str, t: int, old: int, new: int) -> None:
        """Rule "reconcile in place": the charge keeps its time, only its amount changes."""
        charges = self.charges
        if old > 0:
            if rid not in charges:
                return  # already left the window
            if new > 0:
                charges[rid] = (t, new)
            else:
                del charges[rid]
        elif new > 0:
            # The estimate charged nothing, so there is no entry to update: insert one
            # at its own time. Only estimates of 0 units come here (rare), so the
            # rebuild when it lands mid-log is acceptable.
            newest_t = next(reversed(charges.values()))[0] if charges else t
            charges[rid] = (t, new)
            if t < newest_t:
                ordered = sorted(charges.items(), key=lambda item: item[1][0])
                charges.clear()
                charges.update(ordered)
        self.total += new - old

    def reset_us(self, now_us: int) -> int:
        """Until the newest charge leaves, i.e. the window holds no charge at all."""
        if not self.charges:
            return 0
        newest_t = next(reversed(self.charges.values()))[0]
        return newest_t + self.window_us - now_us

    def retry_us(self, now_us: int, amount: int, limit: int) -> int:
        """Rule "earliest fit": walk oldest-first until enough has left for `amount`."""
        need = self.total + amount - limit
        freed = 0
        for walked, (t, charge) in enumerate(self.charges.values()):
            if walked >= RETRY_WALK_CAP:
                break
            freed += charge
            if freed >= need:
                return t + self.window_us - now_us
        return self.window_us


# What reconcile needs to find a reservation's charges again:
# (decision time µs, ((limit key, kind, window µs, estimate), ...), expiry µs, reconciled).
# A plain tuple of numbers and strings, not an object: CPython stops tracking such tuples
# in its collector, so a window's worth of reservations (tens of thousands) is not walked
# by every full collection (benchmarks/RESULTS.md, "Collector pauses").
_Record = tuple[int, tuple[tuple[str, Kind, int, int], ...], int, bool]


class MemoryStore:
    """LimiterStore kept in this process. `now` is injectable for exact tests."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._logs: dict[str, _Log] = {}
        self._records: dict[str, _Record] = {}
        self._expiries: list[tuple[int, str]] = []  # heap of (expires_us, rid)
        self._ops_since_sweep = 0

    @property
    def tracked_keys(self) -> int:
        """Limit keys held right now (idle ones are swept, like Redis TTLs)."""
        return len(self._logs)

    @property
    def tracked_reservations(self) -> int:
        return len(self._records)

    def knows(self, reservation_id: str) -> bool:
        """Whether this store holds the reservation (FailoverStore routes reconcile by it)."""
        return reservation_id in self._records

    async def reserve(
        self, reservation_id: str, limits: Sequence[Limit], estimate: Usage
    ) -> Decision:
        """All limits checked, then all charged (or none)."""
        check_request(reservation_id, limits)
        now = self._now_us()
        self._housekeep(now)
        if reservation_id in self._records:
            raise DuplicateReservation(f"reservation id {reservation_id!r} is in use")
        amounts = [estimate.amount(limit.kind) for limit in limits]
        logs = [self._log(limit, now) for limit in limits]

        refused: int | None = None
        too_large = False
        retry: int | None = None
        # Rule "too large first": a request that can never fit is told so, not retried.
        for i, limit in enumerate(limits):
            if amounts[i] > limit.limit:
                refused, too_large = i, True
                break
        if refused is None:
            for i, limit in enumerate(limits):
                if logs[i].total + amounts[i] > limit.limit:
                    refused = i
                    retry = logs[i].retry_us(now, amounts[i], limit.limit)
                    break
        if refused is None and limits:
            # Rule "all or nothing": charges are written only once every limit agreed.
            for log, amount in zip(logs, amounts, strict=True):
                log.add(reservation_id, now, amount)
            self._keep_record(reservation_id, now, limits, amounts)

        return make_decision(
            reservation_id,
            limits,
            amounts,
            used=[log.total for log in logs],
            reset_us=[log.reset_us(now) for log in logs],
            refused=refused,
            too_large=too_large,
            retry_us=retry,
            store_mode="ok",
        )

    async def reconcile(self, reservation_id: str, actual: Usage) -> bool:
        """Replace the estimate by the real usage in every charge still in its window."""
        now = self._now_us()
        self._housekeep(now)
        record = self._records.get(reservation_id)
        if record is None:
            return False
        t, charges, expires_us, done = record
        if done or expires_us <= now:
            return False
        for key, kind, window_us, estimated in charges:
            amount = actual.amount(kind)
            if amount == estimated or t + window_us <= now:
                continue  # nothing to change, or the charge left: the past stays
            log = self._logs.get(key)
            if log is None:
                if estimated > 0:
                    continue  # its charge is gone already
                log = self._logs[key] = _Log(window_us)  # swept while it held nothing
            else:
                log.prune(now)
            log.replace(reservation_id, t, estimated, amount)
        self._records[reservation_id] = (t, charges, expires_us, True)
        return True

    async def charge(self, charge_id: str, limits: Sequence[Limit], usage: Usage) -> bool:
        """Add `usage` to every limit's log now, unchecked, and keep the record a
        reservation keeps (model.LimiterStore.charge)."""
        check_request(charge_id, limits)
        now = self._now_us()
        self._housekeep(now)
        # The record outlives each of the id's log entries (the longest window): it alone
        # tells that the id is in use, even when its charges are all 0 (no log entry).
        if charge_id in self._records:
            raise DuplicateReservation(f"charge id {charge_id!r} is in use")
        amounts = [usage.amount(limit.kind) for limit in limits]
        for limit, amount in zip(limits, amounts, strict=True):
            if amount > 0:
                self._log(limit, now).add(charge_id, now, amount)
        if limits:
            self._keep_record(charge_id, now, limits, amounts)
        return True

    async def close(self) -> None:
        self._logs.clear()
        self._records.clear()
        self._expiries.clear()

    def _keep_record(
        self, rid: str, now: int, limits: Sequence[Limit], amounts: Sequence[int]
    ) -> None:
        """What reconcile finds the charges by, kept until the longest window ends."""
        charges = tuple(
            (limit.key, limit.kind, limit.window_ms * 1000, amount)
            for limit, amount in zip(limits, amounts, strict=True)
        )
        expires = now + max(window_us for _, _, window_us, _ in charges)
        self._records[rid] = (now, charges, expires, False)
        heapq.heappush(self._expiries, (expires, rid))

    def _now_us(self) -> int:
        return round(self._now() * US_PER_S)

    def _log(self, limit: Limit, now: int) -> _Log:
        log = self._logs.get(limit.key)
        if log is None:
            log = self._logs[limit.key] = _Log(limit.window_ms * 1000)
        else:
            log.prune(now)
        return log

    def _housekeep(self, now: int) -> None:
        """Forget expired reservations; every len(logs) calls, drop idle logs.

        The sweep costs O(keys) once per O(keys) calls: O(1) amortised, and memory
        stays bounded by the keys active within one window (Redis gets this from TTLs).
        """
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, rid = heapq.heappop(expiries)
            record = self._records.get(rid)
            if record is not None and record[2] <= now:  # its expiry
                del self._records[rid]
        self._ops_since_sweep += 1
        if self._ops_since_sweep >= max(64, len(self._logs)):
            self._ops_since_sweep = 0
            for key, log in list(self._logs.items()):
                log.prune(now)
                if not log.charges:
                    del self._logs[key]
