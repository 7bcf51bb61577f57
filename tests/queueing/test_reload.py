"""Hot reload: new capacities and bounds apply at once; removed classes shed their waiters."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from sluicegate.filters.queueing import ClassPolicy, GatePolicy, PriorityGate, Shed

from .helpers import classes, drain, gate, granted, queue, settle


async def test_growing_capacity_wakes_waiters_that_now_fit() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("standard", 0)
    waiters = [await queue(g, "standard") for _ in range(3)]
    g.update_policy(dataclasses.replace(g.policy, max_requests=3))
    await settle()
    assert [t.done() for t in waiters] == [True, True, False]  # FIFO, as many as fit
    assert g.in_flight == 3
    await drain(*waiters)
    holder.release()
    assert (g.in_flight, g.queued) == (0, 0)


async def test_growing_token_capacity_wakes_waiters() -> None:
    g = gate(max_requests=None, max_tokens=100)
    holder = await g.acquire("standard", 80)
    waiter = await queue(g, "standard", 50)
    g.update_policy(dataclasses.replace(g.policy, max_tokens=200))
    await settle()
    granted(waiter).release()
    holder.release()
    assert g.in_flight_tokens == 0


async def test_shrinking_capacity_revokes_nothing_but_holds_new_admissions() -> None:
    g = gate(max_requests=3)
    slots = [await g.acquire("standard", 0) for _ in range(3)]
    g.update_policy(dataclasses.replace(g.policy, max_requests=1))
    assert g.in_flight == 3
    waiter = await queue(g, "standard")
    slots[0].release()
    slots[1].release()
    await settle()
    assert not waiter.done()  # 1 in flight = the new capacity
    slots[2].release()
    await settle()
    granted(waiter).release()
    assert g.in_flight == 0


async def test_headroom_change_applies_at_once() -> None:
    g = gate(max_requests=4)
    slots = [await g.acquire("batch", 0) for _ in range(2)]
    g.update_policy(dataclasses.replace(g.policy, headroom=0.5))
    waiter = await queue(g, "batch")  # lower classes now get 2 of 4
    top = await g.acquire("interactive", 0)
    g.update_policy(dataclasses.replace(g.policy, headroom=0.0))
    await settle()
    granted(waiter).release()
    for slot in (*slots, top):
        slot.release()
    assert g.in_flight == 0


async def test_removed_class_sheds_its_waiters_as_displaced() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("interactive", 0)
    batch = [await queue(g, "batch") for _ in range(2)]
    standard = await queue(g, "standard")
    bulk = ClassPolicy("bulk", 4, 1.0)
    g.update_policy(GatePolicy((*classes()[:2], bulk), max_requests=1))
    for task in batch:
        with pytest.raises(Shed) as info:
            await task
        assert (info.value.reason, info.value.priority) == ("displaced", "batch")
        assert "removed" in info.value.message
    with pytest.raises(ValueError):
        await g.acquire("batch", 0)
    assert g.depth("standard") == 1
    later = await queue(g, "bulk")  # the new class works
    assert g.queued == 2
    holder.release()
    await settle()
    granted(standard).release()
    await settle()
    granted(later).release()
    assert (g.in_flight, g.queued) == (0, 0)


async def test_reordered_classes_change_who_goes_first() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("standard", 0)
    batch = await queue(g, "batch")
    interactive = await queue(g, "interactive")
    g.update_policy(GatePolicy(tuple(reversed(classes())), max_requests=1))
    holder.release()
    await settle()
    assert batch.done() and not interactive.done()
    await drain(batch, interactive)
    assert (g.in_flight, g.queued) == (0, 0)


async def test_shortened_queues_shed_the_newest_and_lowest_first() -> None:
    g = gate(max_requests=1, max_queue=4)
    holder = await g.acquire("interactive", 0)
    standard = [await queue(g, "standard") for _ in range(3)]
    batch = [await queue(g, "batch") for _ in range(2)]
    shorter = tuple(dataclasses.replace(c, max_queue=2) for c in classes())
    g.update_policy(GatePolicy(shorter, max_requests=1, max_queued=3))
    await settle()
    # the standard queue keeps its 2 oldest; the total bound then drops batch, newest first
    assert [t.done() for t in standard] == [False, False, True]
    assert [t.done() for t in batch] == [False, True]
    assert g.queued == 3
    for task in (standard[2], batch[1]):
        assert isinstance(task.exception(), Shed)
    g.update_policy(GatePolicy(shorter, max_requests=1, max_queued=1))
    await settle()
    assert batch[0].done()  # the lowest class goes first,
    assert standard[1].done()  # then the newest of the next
    assert isinstance(batch[0].exception(), Shed)
    assert isinstance(standard[1].exception(), Shed)
    assert g.snapshot()["classes"]["batch"]["shed"]["displaced"] == 2
    survivor = standard[0]
    assert not survivor.done()
    holder.release()
    await settle()
    granted(survivor).release()
    await drain(*standard, *batch)
    assert (g.in_flight, g.queued) == (0, 0)


async def test_changed_max_wait_moves_the_deadline() -> None:
    g = gate(max_requests=1, max_wait_s=30.0)
    holder = await g.acquire("standard", 0)
    waiter = await queue(g, "standard")
    fast = tuple(dataclasses.replace(c, max_wait_s=0.05) for c in classes())
    g.update_policy(GatePolicy(fast, max_requests=1))
    await asyncio.wait([waiter], timeout=5.0)  # far below the old 30 s deadline
    assert waiter.done()
    with pytest.raises(Shed) as info:
        await waiter
    assert info.value.reason == "queue_timeout"
    holder.release()
    assert (g.in_flight, g.queued) == (0, 0)


async def test_update_refuses_a_non_policy() -> None:
    g = PriorityGate("chat", GatePolicy(classes()))
    with pytest.raises(TypeError):
        g.update_policy({"max_requests": 3})  # type: ignore[arg-type]
