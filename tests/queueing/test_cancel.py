"""Client disconnects: a cancelled acquire leaves its queue and never leaks a slot."""

from __future__ import annotations

import asyncio
import gc

import pytest

from sluicegate.filters.queueing import ClassPolicy, GatePolicy, PriorityGate, Shed

from .helpers import at_once, classes, gate, granted, queue, settle


async def test_cancel_while_queued_leaves_the_queue() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("standard", 7)
    gone = await queue(g, "standard", 3)
    behind = await queue(g, "standard", 4)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert g.depth("standard") == 1
    assert (g.in_flight, g.in_flight_tokens) == (1, 7)
    holder.release()
    await settle()
    assert granted(behind).tokens == 4  # the slot skipped the cancelled waiter
    granted(behind).release()
    assert (g.in_flight, g.in_flight_tokens, g.queued) == (0, 0, 0)


async def test_cancel_racing_a_grant_returns_the_slot() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("standard", 0)
    racer = await queue(g, "standard", 5)
    behind = await queue(g, "standard", 6)
    holder.release()  # grants racer synchronously; its task has not resumed yet
    assert (g.in_flight, g.in_flight_tokens) == (1, 5)
    racer.cancel()  # the client goes away in that instant
    with pytest.raises(asyncio.CancelledError):
        await racer
    await settle()
    assert granted(behind).tokens == 6  # the returned grant went on to the next waiter
    assert (g.in_flight, g.in_flight_tokens) == (1, 6)
    granted(behind).release()
    assert (g.in_flight, g.in_flight_tokens, g.queued) == (0, 0, 0)


async def test_cancel_between_cancelled_future_and_cleanup_is_never_granted() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("standard", 0)
    gone = await queue(g, "standard")
    behind = await queue(g, "standard")
    gone.cancel()  # its future is cancelled now; its task cleans up on its next step
    holder.release()  # runs before that cleanup
    assert g.in_flight == 1
    await settle()
    assert gone.cancelled()
    granted(behind).release()
    assert (g.in_flight, g.queued) == (0, 0)


async def test_cancel_racing_a_shed_retrieves_the_error() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("standard", 0)
    waiter = await queue(g, "batch")
    g.update_policy(GatePolicy(classes()[:2], max_requests=1))  # batch removed: waiter shed
    waiter.cancel()
    # An error left in a future is reported, when the future is collected, to the loop's
    # exception handler ("Future exception was never retrieved"), not as a warning.
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert reported == []
    holder.release()
    assert (g.in_flight, g.queued) == (0, 0)


async def test_cancelled_blocking_head_lets_the_others_in() -> None:
    g = gate(max_requests=None, max_tokens=100)
    holder = await g.acquire("batch", 50)
    big = await queue(g, "interactive", 80)
    small = await queue(g, "batch", 20)
    big.cancel()
    await settle()
    granted(small).release()
    holder.release()
    assert (g.in_flight_tokens, g.queued) == (0, 0)


async def test_arrival_right_after_a_cancelled_head_is_admitted_at_once() -> None:
    g = gate(max_requests=None, max_tokens=100)
    holder = await g.acquire("batch", 50)
    big = await queue(g, "batch", 80)
    big.cancel()  # its task has not run its cleanup yet
    small = at_once(g.acquire("batch", 20))
    assert g.in_flight_tokens == 70
    small.release()
    holder.release()
    await settle()
    assert big.cancelled()
    assert (g.in_flight_tokens, g.queued) == (0, 0)


async def test_caller_timeout_holds_nothing() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("standard", 0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(g.acquire("standard", 9), timeout=0.01)
    assert (g.in_flight, g.in_flight_tokens, g.queued) == (1, 0, 0)
    holder.release()
    assert g.in_flight == 0


async def test_cancelled_waiters_do_not_take_shed_counts() -> None:
    policy = GatePolicy((ClassPolicy("standard", 4, 0.02),), max_requests=1)
    g = PriorityGate("chat", policy)
    holder = await g.acquire("standard", 0)
    gone = await queue(g, "standard")
    timed_out = await queue(g, "standard")
    gone.cancel()
    with pytest.raises(Shed):
        await timed_out
    assert gone.cancelled()
    assert g.snapshot()["classes"]["standard"]["shed"]["queue_timeout"] == 1
    holder.release()
    assert (g.in_flight, g.queued) == (0, 0)
