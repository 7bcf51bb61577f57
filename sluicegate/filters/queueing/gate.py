"""PriorityGate: a concurrency limit with bounded per-class queues and shedding.

One gate guards one route. The ext_proc handler awaits `acquire` while Envoy
holds the request and releases the slot when the response ends; grpc.aio
cancels the awaiting task when the client goes away. Everything runs on one
event loop, so no locks: each method changes state without awaiting, and the
only await (a queued waiter's future) leaves the gate consistent.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .estimate import HoldTimes, retry_after_s
from .policy import Capacity, ClassPolicy, GatePolicy, class_capacity
from .shed import SHED_REASONS, Shed, ShedReason
from .slot import Slot


class _ClassState:
    """Queue and counters of one class; kept across reloads that keep its name."""

    __slots__ = ("admitted", "capacity", "policy", "queue", "rank", "shed")

    def __init__(self, policy: ClassPolicy, rank: int, capacity: Capacity) -> None:
        self.policy = policy
        self.rank = rank
        self.capacity = capacity
        self.queue: deque[_Waiter] = deque()
        self.admitted = 0
        self.shed: dict[ShedReason, int] = dict.fromkeys(SHED_REASONS, 0)

    @property
    def name(self) -> str:
        return self.policy.name


class _Waiter:
    """A queued request: its future gets a Slot (granted) or a Shed (dropped)."""

    __slots__ = ("cls", "enqueued_at", "future", "queued", "started", "timer", "tokens")

    def __init__(
        self, cls: _ClassState, tokens: int, future: asyncio.Future[Slot], enqueued_at: float
    ) -> None:
        self.cls = cls
        self.tokens = tokens
        self.future = future
        self.enqueued_at = enqueued_at  # the gate's clock, for queued_s
        self.started = future.get_loop().time()  # the loop's clock, for the deadline
        self.timer: asyncio.TimerHandle | None = None
        self.queued = True


def _check_tokens(tokens: int) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")


class PriorityGate:
    """Bounds requests and estimated tokens in flight; orders the rest by priority class.

    Admission: a request is admitted at once when it fits its class's capacity
    (see `class_capacity`: lower classes leave `headroom` to the top class) and
    no waiter of its own or a higher class is queued. Otherwise it waits in its
    class's bounded queue. Freed capacity goes to waiters highest class first,
    FIFO within a class; the first head waiter that does not fit stops the
    grant, so no lower class and no smaller request overtakes it (big requests
    are not starved).

    A request whose tokens alone exceed its class's token capacity could never
    fit beside others; it is admitted only when nothing at all is in flight.

    Shedding: an arrival to a full class queue is shed ("queue_full"). When
    `max_queued` waiters are queued across all classes, an arrival displaces
    the newest waiter of the lowest non-empty class below its own
    ("displaced"), or is shed ("queue_full") if no lower class waits. A waiter
    still queued after its class's `max_wait_s` is shed ("queue_timeout").

    A waiter whose task is cancelled leaves its queue when the task next runs
    (the same loop iteration's callbacks); until then it still counts in
    `depth`, but it is never granted.

    `now` is the clock for `queued_s` and hold times; deadlines run on the
    event loop's own timer.
    """

    def __init__(
        self,
        name: str,
        policy: GatePolicy,
        *,
        now: Callable[[], float] = time.monotonic,
        kind: str = "route",
    ) -> None:
        if not isinstance(policy, GatePolicy):
            raise TypeError(f"policy must be a GatePolicy, got {type(policy).__name__}")
        self.name = name
        self.kind = kind  # what the gate guards, for messages: "the batch queue of route chat"
        self._now = now
        self._policy = policy
        self._classes = [
            _ClassState(cp, rank, class_capacity(policy, rank))
            for rank, cp in enumerate(policy.classes)
        ]
        self._by_name = {state.name: state for state in self._classes}
        self._in_flight = 0
        self._in_flight_tokens = 0
        self._queued = 0  # waiters of all classes, kept equal to the sum of queue lengths
        self._holds = HoldTimes()

    # -- reading -------------------------------------------------------------------------------

    @property
    def policy(self) -> GatePolicy:
        return self._policy

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def in_flight_tokens(self) -> int:
        return self._in_flight_tokens

    @property
    def queued(self) -> int:
        """Waiters of all classes together."""
        return self._queued

    def depth(self, priority: str) -> int:
        """Waiters queued in one class; ValueError for an unknown class."""
        return len(self._class(priority).queue)

    def snapshot(self) -> dict[str, Any]:
        """Depths, in-flight figures, capacities and counters, as plain data (for /status)."""
        return {
            "name": self.name,
            "in_flight": self._in_flight,
            "in_flight_tokens": self._in_flight_tokens,
            "queued": self._queued,
            "max_requests": self._policy.max_requests,
            "max_tokens": self._policy.max_tokens,
            "headroom": self._policy.headroom,
            "max_queued": self._policy.max_queued,
            "mean_hold_s": self._holds.mean_s,
            "classes": {
                state.name: {
                    "depth": len(state.queue),
                    "max_queue": state.policy.max_queue,
                    "max_wait_s": state.policy.max_wait_s,
                    "max_requests": state.capacity.requests,
                    "max_tokens": state.capacity.tokens,
                    "admitted": state.admitted,
                    "shed": dict(state.shed),
                }
                for state in self._classes
            },
        }

    # -- admission -----------------------------------------------------------------------------

    def try_acquire(self, priority: str, tokens: int) -> Slot | None:
        """A slot now if the request would be admitted without waiting, else None (and
        nothing changes); ValueError for bad input. The caller can then skip whatever
        waiting costs (the ext_proc timeout override) for the common case."""
        cls = self._class(priority)
        _check_tokens(tokens)
        # Settle first: a waiter cancelled since the last change may still sit at a queue head.
        # With nothing queued (the common case) there is nothing to settle or to wait behind.
        if self._queued:
            self._dispatch()
        if self._fits(cls, tokens) and not (self._queued and self._waiting_through(cls.rank)):
            return self._admit(cls, tokens, queued_s=0.0)
        return None

    async def acquire(self, priority: str, tokens: int) -> Slot:
        """Admit now or wait in the class's queue; raises Shed, or ValueError for bad input.

        Cancelling the awaiting task (client gone) leaves the queue and holds
        nothing, even if the grant raced the cancellation.
        """
        slot = self.try_acquire(priority, tokens)
        if slot is not None:
            return slot
        cls = self._class(priority)
        if len(cls.queue) >= cls.policy.max_queue:
            raise self._refuse(
                cls, f"the {cls.name} queue of {self._where} is full ({len(cls.queue)} waiting)"
            )
        max_queued = self._policy.max_queued
        if max_queued is not None and self._queued >= max_queued:
            victim = self._lowest_waiting_below(cls.rank)
            if victim is None:
                raise self._refuse(
                    cls,
                    f"the queues of {self._where} are full ({self._queued} waiting, "
                    f"none of lower priority than {cls.name})",
                )
            self._shed_waiter(
                victim.queue[-1],
                "displaced",
                f"a request of higher priority took the place of this {victim.name} request "
                f"in the queues of {self._where}",
            )
        waiter = self._enqueue(cls, tokens)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise

    def update_policy(self, policy: GatePolicy) -> None:
        """Swap in a new policy; new capacities apply at once.

        Waiters that now fit are granted. Waiters of a class the policy no
        longer has are shed ("displaced"), and so are the newest waiters beyond
        shortened queue bounds (lowest class first for `max_queued`). Queued
        waiters keep their arrival time; a changed `max_wait_s` moves their
        deadline. Slots already granted are never revoked: when capacity
        shrinks below what is in flight, new admissions wait for releases.
        """
        if not isinstance(policy, GatePolicy):
            raise TypeError(f"policy must be a GatePolicy, got {type(policy).__name__}")
        old = self._by_name
        classes: list[_ClassState] = []
        for rank, cp in enumerate(policy.classes):
            capacity = class_capacity(policy, rank)
            state = old.get(cp.name)
            if state is None:
                state = _ClassState(cp, rank, capacity)
            else:
                wait_changed = state.policy.max_wait_s != cp.max_wait_s
                state.policy, state.rank, state.capacity = cp, rank, capacity
                if wait_changed:
                    for waiter in state.queue:
                        self._arm(waiter)
            classes.append(state)
        self._policy = policy
        self._classes = classes
        self._by_name = {state.name: state for state in classes}

        for name, state in old.items():
            if name not in self._by_name:
                while state.queue:
                    self._shed_waiter(
                        state.queue[-1],
                        "displaced",
                        f"priority class {name} was removed from {self._where}",
                    )
        for state in classes:
            while len(state.queue) > state.policy.max_queue:
                self._shed_waiter(
                    state.queue[-1],
                    "displaced",
                    f"the {state.name} queue of {self._where} was shortened to "
                    f"{state.policy.max_queue}",
                )
        if policy.max_queued is not None:
            while self._queued > policy.max_queued:
                victim = self._lowest_waiting_below(-1)
                assert victim is not None  # _queued > 0 means some class waits
                self._shed_waiter(
                    victim.queue[-1],
                    "displaced",
                    f"the queues of {self._where} were shortened to {policy.max_queued}",
                )
        self._dispatch()

    # -- internals -----------------------------------------------------------------------------

    @property
    def _where(self) -> str:
        return f"{self.kind} {self.name}"

    def _class(self, priority: str) -> _ClassState:
        state = self._by_name.get(priority)
        if state is None:
            known = ", ".join(self._by_name)
            raise ValueError(f"unknown priority class {priority!r} for {self._where} ({known})")
        return state

    def _fits(self, cls: _ClassState, tokens: int) -> bool:
        requests, token_cap = cls.capacity
        if requests is not None and self._in_flight >= requests:
            return False
        if token_cap is not None and self._in_flight_tokens + tokens > token_cap:
            # Oversize: it could never fit beside others, so it runs alone.
            return tokens > token_cap and self._in_flight == 0
        return True

    def _waiting_through(self, rank: int) -> bool:
        """Whether a class of this rank or higher has waiters (they go first)."""
        return any(self._classes[r].queue for r in range(rank + 1))

    def _lowest_waiting_below(self, rank: int) -> _ClassState | None:
        for state in reversed(self._classes[rank + 1 :]):
            if state.queue:
                return state
        return None

    def _admit(self, cls: _ClassState, tokens: int, queued_s: float) -> Slot:
        self._in_flight += 1
        self._in_flight_tokens += tokens
        cls.admitted += 1
        return Slot(cls.name, tokens, queued_s, self._now(), self._release)

    def _release(self, slot: Slot) -> None:
        self._in_flight -= 1
        self._in_flight_tokens -= slot.tokens
        self._holds.add(self._now() - slot.granted_at)
        if self._queued:
            self._dispatch()

    def _dispatch(self) -> None:
        """Grant queue heads highest class first while they fit; stop at the first that does not."""
        for cls in self._classes:
            queue = cls.queue
            while queue:
                waiter = queue[0]
                if waiter.future.done():  # its task was cancelled and has not run yet
                    queue.popleft()
                    self._forget(waiter)
                    continue
                if not self._fits(cls, waiter.tokens):
                    return
                queue.popleft()
                self._forget(waiter)
                queued_s = max(0.0, self._now() - waiter.enqueued_at)
                waiter.future.set_result(self._admit(cls, waiter.tokens, queued_s))

    def _enqueue(self, cls: _ClassState, tokens: int) -> _Waiter:
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(cls, tokens, future, self._now())
        cls.queue.append(waiter)
        self._queued += 1
        self._arm(waiter)
        return waiter

    def _arm(self, waiter: _Waiter) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
        deadline = waiter.started + waiter.cls.policy.max_wait_s
        waiter.timer = waiter.future.get_loop().call_at(deadline, self._expire, waiter)

    def _forget(self, waiter: _Waiter) -> None:
        """Bookkeeping once a waiter has left its queue."""
        waiter.queued = False
        self._queued -= 1
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None

    def _unqueue(self, waiter: _Waiter) -> None:
        waiter.cls.queue.remove(waiter)
        self._forget(waiter)

    def _expire(self, waiter: _Waiter) -> None:
        if not waiter.queued:
            return
        cls = waiter.cls
        self._shed_waiter(
            waiter,
            "queue_timeout",
            f"no capacity on {self._where} within {cls.policy.max_wait_s:g} s "
            f"in the {cls.name} queue",
        )
        # It may have been a head blocking smaller or lower-class requests.
        self._dispatch()

    def _shed_waiter(self, waiter: _Waiter, reason: ShedReason, message: str) -> None:
        """Drop a queued waiter and hand it a Shed (unless its task is already cancelled)."""
        cls = waiter.cls
        ahead = cls.queue.index(waiter)
        if self._by_name.get(cls.name) is cls:
            ahead += sum(len(state.queue) for state in self._classes[: cls.rank])
            capacity = cls.capacity
        else:  # its class was just removed
            capacity = Capacity(self._policy.max_requests, self._policy.max_tokens)
        self._unqueue(waiter)
        if waiter.future.done():
            return
        cls.shed[reason] += 1
        waiter.future.set_exception(
            Shed(
                reason,
                cls.name,
                retry_after_s=self._retry_after(ahead, capacity),
                queued_s=max(0.0, self._now() - waiter.enqueued_at),
                message=message,
            )
        )

    def _refuse(self, cls: _ClassState, message: str) -> Shed:
        """The Shed for an arrival that may not even wait."""
        cls.shed["queue_full"] += 1
        ahead = sum(len(state.queue) for state in self._classes[: cls.rank + 1])
        return Shed(
            "queue_full",
            cls.name,
            retry_after_s=self._retry_after(ahead, cls.capacity),
            queued_s=0.0,
            message=message,
        )

    def _retry_after(self, ahead: int, capacity: Capacity) -> int:
        """See `retry_after_s`; with unbounded requests the slots in use stand for the capacity."""
        concurrency = capacity.requests if capacity.requests is not None else self._in_flight
        return retry_after_s(ahead, self._holds.mean_s, concurrency)

    def _abandon(self, waiter: _Waiter) -> None:
        """The awaiting task was cancelled: leave the queue, or give back a grant it never saw."""
        if waiter.queued:
            self._unqueue(waiter)
            self._dispatch()
            return
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            future.result().release()
