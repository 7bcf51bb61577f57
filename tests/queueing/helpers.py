"""Shared builders for the priority gate tests."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from sluicegate.filters.queueing import ClassPolicy, GatePolicy, PriorityGate, Slot

CLASS_NAMES = ("interactive", "standard", "batch")


def classes(max_queue: int = 8, max_wait_s: float = 5.0) -> tuple[ClassPolicy, ...]:
    """interactive > standard > batch, all with the same bounds."""
    return tuple(ClassPolicy(name, max_queue, max_wait_s) for name in CLASS_NAMES)


def gate(
    max_requests: int | None = 1,
    max_tokens: int | None = None,
    *,
    headroom: float = 0.0,
    max_queued: int | None = None,
    max_queue: int = 8,
    max_wait_s: float = 5.0,
) -> PriorityGate:
    policy = GatePolicy(
        classes(max_queue, max_wait_s),
        max_requests=max_requests,
        max_tokens=max_tokens,
        headroom=headroom,
        max_queued=max_queued,
    )
    return PriorityGate("chat", policy)


async def settle(rounds: int = 5) -> None:
    """Let ready tasks and callbacks run (no wall-clock wait)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def queue(g: PriorityGate, priority: str, tokens: int = 0) -> asyncio.Task[Slot]:
    """Start an acquire that is expected to wait; returns once it is queued."""
    task = asyncio.create_task(g.acquire(priority, tokens))
    await settle()
    assert not task.done(), "expected the request to wait"
    return task


def granted(task: asyncio.Task[Slot]) -> Slot:
    assert task.done(), "expected a grant"
    return task.result()


class FakeClock:
    """A hand-driven `now` for hold times and queued_s (deadlines still use the loop)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


async def drain(*tasks: asyncio.Task[Slot]) -> None:
    """End a test's leftover requests: cancel the waiting ones, release every slot."""
    for task in tasks:
        task.cancel()  # no-op for finished tasks
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, Slot):
            result.release()


def at_once(acquire: Coroutine[Any, Any, Slot]) -> Slot:
    """Run an acquire that must finish without suspending (admitted at once)."""
    try:
        acquire.send(None)
    except StopIteration as done:
        slot: Slot = done.value
        return slot
    acquire.close()
    raise AssertionError("the request had to wait")
