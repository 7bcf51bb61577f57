"""Keep deciding when Redis is gone: fail open, fail closed, or count locally.

Rule "no per-request timeout while down": once down, no request touches Redis; one
background probe PINGs it every probe_interval_s and switches back when it answers.
Each switch is one log line and one observer call, never one per request.

Down means `failures_to_down` failed calls in a row (3): one late answer on a busy
replica (the timeout also counts event-loop lag) must not send a whole replica to its
fallback for a second. Each failed call's request is decided by the fallback. Two kinds
of failed call are this process's overload, not Redis's, and never count toward down:
- one that found no free pooled connection (StoreBusy);
- rule "answered meanwhile": one during which another call got Redis's answer. A burst
  on a loaded replica opens connections that time out connecting while the pooled ones
  keep answering; a dead Redis answers nobody, so calls started after it died count.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Literal, get_args

from .decision import unknown_decision
from .memory import MemoryStore
from .model import (
    Decision,
    DuplicateReservation,
    Limit,
    OnFailure,
    StoreBusy,
    StoreObserver,
    StoreUnavailable,
    Usage,
    check_request,
)
from .redis_store import RedisStore

log = logging.getLogger("sluicegate.limiter")

State = Literal["up", "down"]


class FailoverStore:
    """LimiterStore over a RedisStore with a fallback while Redis is down.

    The observer hears state changes, and the latency and failures of Redis calls
    unless the RedisStore already reports those to this same observer (rule "each
    event once per observer": passing one observer to both stores is fine).
    Decisions made without Redis are not store calls: they have no latency sample.
    """

    def __init__(
        self,
        primary: RedisStore,
        *,
        on_failure: OnFailure,
        replicas: int = 1,
        probe_interval_s: float = 1.0,
        observer: StoreObserver | None = None,
        failures_to_down: int = 3,
    ) -> None:
        if on_failure not in get_args(OnFailure):
            raise ValueError(f"on_failure must be one of {get_args(OnFailure)}: {on_failure!r}")
        if probe_interval_s <= 0:
            raise ValueError(f"probe_interval_s must be > 0, got {probe_interval_s!r}")
        self._primary = primary
        self._on_failure: OnFailure = on_failure
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas!r}")
        self._replicas = replicas
        self._probe_interval_s = probe_interval_s
        self._observer = observer
        self._local = MemoryStore()
        self._state: State = "up"
        if failures_to_down < 1:
            raise ValueError(f"failures_to_down must be >= 1, got {failures_to_down!r}")
        self._failures_to_down = failures_to_down
        self._failures_in_a_row = 0
        self._last_answer = float("-inf")  # perf_counter when Redis last answered a call
        self._probe: asyncio.Task[None] | None = None
        self._dropped_reconciles = 0
        self._dropped_charges = 0

    @property
    def state(self) -> State:
        return self._state

    @property
    def dropped_reconciles(self) -> int:
        """Reconciles not applied because Redis was down. For a reservation made in
        Redis its charge stays at the estimate until it leaves the window."""
        return self._dropped_reconciles

    @property
    def dropped_charges(self) -> int:
        """Charges (model.LimiterStore.charge) not counted anywhere: Redis was down and
        on_failure is not `local`."""
        return self._dropped_charges

    async def reserve(
        self, reservation_id: str, limits: Sequence[Limit], estimate: Usage
    ) -> Decision:
        check_request(reservation_id, limits)
        if self._state == "up":
            started = time.perf_counter()
            try:
                decision = await self._primary.reserve(reservation_id, limits, estimate)
            except StoreUnavailable as exc:
                self._failed("reserve", exc, started)
            else:
                self._answered()
                return decision
            finally:
                self._latency("reserve", started)
        return await self._fallback(reservation_id, limits, estimate)

    async def reconcile(self, reservation_id: str, actual: Usage) -> bool:
        """Where the reservation was made: locally if the local store holds it,
        else in Redis; while Redis is down such a reconcile is dropped."""
        if self._local.knows(reservation_id):
            return await self._local.reconcile(reservation_id, actual)
        if self._state == "up":
            started = time.perf_counter()
            try:
                applied = await self._primary.reconcile(reservation_id, actual)
            except StoreUnavailable as exc:
                self._failed("reconcile", exc, started)
            else:
                self._answered()
                return applied
            finally:
                self._latency("reconcile", started)
        self._dropped_reconciles += 1
        return False

    async def charge(self, charge_id: str, limits: Sequence[Limit], usage: Usage) -> bool:
        """In Redis; while it is down, with `local`, in the local store at each limit's
        share (as the fallback decides; it keeps the charge's record there, so reconcile
        finds it), else dropped (nothing counts while down, and there is nothing to
        reconcile; the observer hears of each). An id the local store holds is in use, in
        Redis too: Redis came back since that charge was made there, and must not count
        the request again."""
        check_request(charge_id, limits)
        if self._local.knows(charge_id):
            raise DuplicateReservation(f"charge id {charge_id!r} is in use")
        if self._state == "up":
            started = time.perf_counter()
            try:
                await self._primary.charge(charge_id, limits, usage)
            except StoreUnavailable as exc:
                self._failed("charge", exc, started)
            else:
                self._answered()
                return True
            finally:
                self._latency("charge", started)
        if self._on_failure != "local":
            self._dropped_charges += 1
            if self._observer is not None:
                self._observer.charge_dropped()
            return False
        local_limits = [self._share(lim) for lim in limits]
        return await self._local.charge(charge_id, local_limits, usage)

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
            self._probe = None
        await self._local.close()
        await self._primary.close()

    async def _fallback(
        self, reservation_id: str, limits: Sequence[Limit], estimate: Usage
    ) -> Decision:
        if self._on_failure == "fail_open":
            return unknown_decision(reservation_id, True, "fail_open")
        if self._on_failure == "fail_closed":
            return unknown_decision(reservation_id, False, "fail_closed")
        # Rule "limit ÷ replicas": each replica counts alone, so together they
        # admit about what the shared limit would have.
        local_limits = [self._share(limit) for limit in limits]
        decision = await self._local.reserve(reservation_id, local_limits, estimate)
        return dataclasses.replace(decision, store_mode="local")

    def _share(self, limit: Limit) -> Limit:
        if self._replicas == 1:
            return limit
        return dataclasses.replace(limit, limit=max(1, limit.limit // self._replicas))

    def _answered(self) -> None:
        self._failures_in_a_row = 0
        self._last_answer = time.perf_counter()

    def _failed(self, op: str, exc: StoreUnavailable, started: float) -> None:
        """Count a failed call toward down, unless it was this process's overload (see the
        module docstring: StoreBusy, and rule "answered meanwhile")."""
        observer = self._call_observer()
        if observer is not None:
            observer.store_failure(op)
        if self._state == "down" or isinstance(exc, StoreBusy) or self._last_answer > started:
            return
        self._failures_in_a_row += 1
        if self._failures_in_a_row < self._failures_to_down:
            return
        self._state = "down"
        self._failures_in_a_row = 0
        log.warning(
            "limiter store down (%s): deciding %s until Redis answers again", exc, self._on_failure
        )
        if self._observer is not None:
            self._observer.store_state("down")
        self._probe = asyncio.get_running_loop().create_task(
            self._probe_until_up(), name="sluicegate-limiter-probe"
        )

    async def _probe_until_up(self) -> None:
        # Connections from before the outage may be dead; new ones are made on demand.
        await self._primary.drop_connections()
        while True:
            await asyncio.sleep(self._probe_interval_s)
            try:
                await self._primary.ping()
            except StoreUnavailable:
                continue
            self._state = "up"
            self._probe = None
            log.info("limiter store up: counting in Redis again")
            if self._observer is not None:
                self._observer.store_state("up")
            return

    def _latency(self, op: str, started: float) -> None:
        observer = self._call_observer()
        if observer is not None:
            observer.store_latency(op, time.perf_counter() - started)

    def _call_observer(self) -> StoreObserver | None:
        """Who hears of Redis calls from here: nobody if the RedisStore tells them."""
        if self._observer is self._primary.observer:
            return None
        return self._observer
