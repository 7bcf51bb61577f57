"""PriorityGate admission rules: capacity, strict priority, headroom, tokens, shedding."""

from __future__ import annotations

import pytest

from sluicegate.filters.queueing import ClassPolicy, GatePolicy, PriorityGate, Shed

from .helpers import FakeClock, at_once, classes, drain, gate, granted, queue, settle


async def test_admits_at_once_while_there_is_room() -> None:
    g = gate(max_requests=2, max_tokens=100)
    a = at_once(g.acquire("batch", 30))
    b = at_once(g.acquire("interactive", 70))
    assert (a.priority, a.tokens, a.queued_s) == ("batch", 30, 0.0)
    assert (b.priority, b.tokens, b.queued_s) == ("interactive", 70, 0.0)
    assert (g.in_flight, g.in_flight_tokens) == (2, 100)
    a.release()
    b.release()
    assert (g.in_flight, g.in_flight_tokens) == (0, 0)


async def test_try_acquire_takes_a_free_slot_and_otherwise_changes_nothing() -> None:
    g = gate(max_requests=1)
    slot = g.try_acquire("standard", 5)
    assert slot is not None and (g.in_flight, g.in_flight_tokens) == (1, 5)
    assert g.try_acquire("interactive", 5) is None  # full: no slot, no queue entry
    assert (g.in_flight, g.queued) == (1, 0)
    waiter = await queue(g, "batch", 5)
    slot.release()
    await settle()
    assert granted(waiter).priority == "batch"
    granted(waiter).release()
    # A waiter of its class or above goes first: try_acquire never jumps it, even when
    # the request would fit (here the waiter is too big for the tokens left).
    t = gate(max_requests=None, max_tokens=10)
    holder = t.try_acquire("standard", 8)
    assert holder is not None
    big = await queue(t, "standard", 5)
    assert t.try_acquire("standard", 1) is None
    assert t.try_acquire("batch", 1) is None
    holder.release()
    await settle()
    granted(big).release()
    assert (t.in_flight, t.queued) == (0, 0)


async def test_unbounded_gate_never_queues() -> None:
    g = gate(max_requests=None, max_tokens=None)
    slots = [await g.acquire("batch", 10**6) for _ in range(100)]
    assert g.in_flight == 100
    for slot in slots:
        slot.release()
    assert (g.in_flight, g.in_flight_tokens) == (0, 0)


async def test_release_is_idempotent() -> None:
    g = gate(max_requests=1)
    slot = await g.acquire("standard", 5)
    waiter = await queue(g, "standard", 5)
    slot.release()
    slot.release()
    await settle()
    assert slot.released
    assert (g.in_flight, g.in_flight_tokens) == (1, 5)  # only the waiter holds
    granted(waiter).release()
    granted(waiter).release()
    assert (g.in_flight, g.in_flight_tokens) == (0, 0)


async def test_unknown_class_and_bad_tokens_raise_value_error() -> None:
    g = gate()
    with pytest.raises(ValueError, match="unknown priority class 'bulk'"):
        await g.acquire("bulk", 1)
    with pytest.raises(ValueError, match="tokens"):
        await g.acquire("batch", -1)
    with pytest.raises(ValueError):
        g.depth("bulk")
    assert g.in_flight == 0


async def test_fifo_within_a_class() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("standard", 0)
    waiters = [await queue(g, "standard") for _ in range(3)]
    assert g.depth("standard") == 3
    order = []
    current = holder
    for _ in waiters:
        current.release()
        await settle()
        done = [i for i, task in enumerate(waiters) if task.done() and i not in order]
        assert len(done) == 1
        order.append(done[0])
        current = granted(waiters[done[0]])
        assert current.queued_s > 0
    assert order == [0, 1, 2]
    current.release()
    assert g.in_flight == 0


async def test_release_grants_highest_class_first() -> None:
    g = gate(max_requests=1)
    holder = await g.acquire("batch", 0)
    batch = await queue(g, "batch")
    standard = await queue(g, "standard")
    interactive = await queue(g, "interactive")
    holder.release()
    await settle()
    assert interactive.done() and not standard.done() and not batch.done()
    granted(interactive).release()
    await settle()
    assert standard.done() and not batch.done()
    granted(standard).release()
    await settle()
    granted(batch).release()
    assert (g.in_flight, g.depth("batch")) == (0, 0)


async def test_release_grants_as_many_as_fit() -> None:
    g = gate(max_requests=None, max_tokens=100)
    holder = await g.acquire("standard", 100)
    small = [await queue(g, "standard", 30) for _ in range(4)]
    holder.release()
    await settle()
    assert [t.done() for t in small] == [True, True, True, False]
    assert g.in_flight_tokens == 90
    for task in small[:3]:
        granted(task).release()
    await settle()
    granted(small[3]).release()
    assert g.in_flight_tokens == 0


async def test_arrival_waits_behind_waiters_of_its_own_or_a_higher_class() -> None:
    g = gate(max_requests=None, max_tokens=100)
    holder = await g.acquire("batch", 60)
    big_standard = await queue(g, "standard", 50)  # 110 > 100: waits
    small_batch = await queue(g, "batch", 10)  # would fit, but a higher class waits
    small_standard = await queue(g, "standard", 10)  # would fit, but its own class waits
    interactive = await g.acquire("interactive", 10)  # higher than every waiter: goes at once
    assert g.in_flight_tokens == 70
    holder.release()
    await settle()
    # 10 + 50 + 10 + 10 = 80: all granted, in priority order
    assert all(t.done() for t in (big_standard, small_standard, small_batch))
    for slot in (interactive, granted(big_standard), granted(small_standard), granted(small_batch)):
        slot.release()
    assert (g.in_flight, g.in_flight_tokens) == (0, 0)


async def test_lower_class_does_not_overtake_a_blocked_head() -> None:
    g = gate(max_requests=None, max_tokens=100)
    a = await g.acquire("batch", 50)
    b = await g.acquire("batch", 40)
    head = await queue(g, "interactive", 60)  # needs a to go
    small = await queue(g, "batch", 5)  # 95 would fit, but the interactive head is first
    b.release()  # 50 + 60 > 100: head still blocked, so nothing moves
    await settle()
    assert not head.done() and not small.done()
    a.release()
    await settle()
    assert head.done() and small.done()
    granted(head).release()
    granted(small).release()
    assert g.in_flight_tokens == 0


async def test_headroom_keeps_a_slot_for_the_top_class() -> None:
    g = gate(max_requests=4, headroom=0.25)
    lower = [
        await g.acquire("batch", 0),
        await g.acquire("standard", 0),
        await g.acquire("batch", 0),
    ]
    standard = await queue(g, "standard")  # 3 of 4 in flight: lower classes are at their share
    batch = await queue(g, "batch")
    top = await g.acquire("interactive", 0)  # the kept slot
    assert g.in_flight == 4
    queued_top = await queue(g, "interactive")  # now really full
    snapshot = g.snapshot()
    assert snapshot["classes"]["interactive"]["max_requests"] == 4
    assert snapshot["classes"]["batch"]["max_requests"] == 3
    top.release()  # 3 in flight: only the top class may take the 4th
    await settle()
    assert queued_top.done() and not standard.done()
    granted(queued_top).release()
    await settle()
    assert not standard.done()  # still 3 lower-class requests in flight
    lower[0].release()
    await settle()
    assert standard.done() and not batch.done()
    for slot in (*lower[1:], granted(standard)):
        slot.release()
    await settle()
    granted(batch).release()
    assert g.in_flight == 0


async def test_headroom_applies_to_tokens() -> None:
    g = gate(max_requests=None, max_tokens=1000, headroom=0.2)
    batch = await g.acquire("batch", 800)
    waiting = await queue(g, "standard", 1)  # 801 > 800
    top = await g.acquire("interactive", 200)
    assert g.in_flight_tokens == 1000
    batch.release()
    await settle()
    granted(waiting).release()
    top.release()
    assert g.in_flight_tokens == 0


async def test_token_capacity_bounds_the_sum_in_flight() -> None:
    g = gate(max_requests=10, max_tokens=100)
    a = await g.acquire("standard", 60)
    b = await g.acquire("standard", 40)
    c = await queue(g, "standard", 1)
    assert g.in_flight_tokens == 100
    b.release()
    await settle()
    assert granted(c).tokens == 1
    assert g.in_flight_tokens == 61
    a.release()
    granted(c).release()
    assert g.in_flight_tokens == 0


async def test_oversize_request_runs_only_alone() -> None:
    g = gate(max_requests=10, max_tokens=100)
    alone = await g.acquire("standard", 500)  # nothing in flight: admitted at once
    assert g.in_flight_tokens == 500
    small = await queue(g, "standard", 1)
    alone.release()
    await settle()
    tiny = granted(small)
    oversize = await queue(g, "standard", 150)  # waits until nothing is in flight
    behind = await queue(g, "standard", 1)  # FIFO: stays behind the oversize head
    tiny.release()
    await settle()
    assert oversize.done() and not behind.done()
    granted(oversize).release()
    await settle()
    granted(behind).release()
    assert (g.in_flight, g.in_flight_tokens) == (0, 0)


async def test_oversize_is_judged_against_the_class_share() -> None:
    g = gate(max_requests=None, max_tokens=100, headroom=0.25)  # lower classes: 75 tokens
    top = await g.acquire("interactive", 10)
    batch_80 = await queue(g, "batch", 80)  # above the batch share: needs an empty gate
    interactive_80 = await g.acquire("interactive", 80)  # 90 <= 100 for the top class
    top.release()
    await settle()
    assert not batch_80.done()
    interactive_80.release()
    await settle()
    granted(batch_80).release()
    assert g.in_flight_tokens == 0


async def test_full_class_queue_sheds_at_once() -> None:
    g = gate(max_requests=1, max_queue=2)
    holder = await g.acquire("batch", 0)
    waiters = [await queue(g, "batch"), await queue(g, "batch")]
    with pytest.raises(Shed) as info:
        await g.acquire("batch", 0)
    shed = info.value
    assert shed.reason == "queue_full"
    assert shed.priority == "batch"
    assert shed.queued_s == 0.0
    assert shed.retry_after_s >= 1
    assert shed.message == "the batch queue of route chat is full (2 waiting)"
    assert str(shed) == shed.message
    other = await queue(g, "standard")  # other classes have their own queues
    assert g.snapshot()["classes"]["batch"]["shed"]["queue_full"] == 1
    holder.release()
    for task in (other, *waiters):
        await settle()
        granted(task).release()
    assert g.in_flight == 0


async def test_zero_queue_class_never_waits() -> None:
    policy = GatePolicy((ClassPolicy("interactive", 4, 1.0), ClassPolicy("batch", 0, 1.0)), 1)
    g = PriorityGate("chat", policy)
    slot = await g.acquire("batch", 0)  # room: admitted
    with pytest.raises(Shed) as info:
        await g.acquire("batch", 0)
    assert info.value.reason == "queue_full"
    slot.release()
    assert g.in_flight == 0


async def test_total_bound_displaces_the_lowest_class_first() -> None:
    g = gate(max_requests=1, max_queued=3)
    holder = await g.acquire("interactive", 0)
    b1 = await queue(g, "batch")
    b2 = await queue(g, "batch")
    s1 = await queue(g, "standard")
    assert g.queued == 3

    i1 = await queue(g, "interactive")  # displaces the newest batch waiter
    with pytest.raises(Shed) as info:
        await b2
    assert info.value.reason == "displaced"
    assert info.value.priority == "batch"
    assert not b1.done()

    s2 = await queue(g, "standard")  # displaces the last batch waiter
    with pytest.raises(Shed):
        await b1
    assert (g.depth("batch"), g.depth("standard"), g.depth("interactive")) == (0, 2, 1)

    with pytest.raises(Shed) as info:  # nothing below standard to displace
        await g.acquire("standard", 0)
    assert info.value.reason == "queue_full"
    with pytest.raises(Shed) as info:
        await g.acquire("batch", 0)
    assert info.value.reason == "queue_full"

    i2 = await queue(g, "interactive")  # displaces the newest standard waiter
    with pytest.raises(Shed) as info:
        await s2
    assert info.value.reason == "displaced"
    assert g.queued == 3

    holder.release()
    for task in (i1, i2, s1):
        await settle()
        granted(task).release()
    assert (g.in_flight, g.queued) == (0, 0)


async def test_waiter_is_shed_after_max_wait() -> None:
    g = gate(max_requests=1, max_wait_s=0.05)
    holder = await g.acquire("standard", 0)
    with pytest.raises(Shed) as info:
        await g.acquire("standard", 0)
    shed = info.value
    assert shed.reason == "queue_timeout"
    assert shed.queued_s >= 0.04
    assert "0.05 s" in shed.message
    assert g.depth("standard") == 0
    assert g.in_flight == 1
    holder.release()
    assert g.in_flight == 0


async def test_timed_out_head_unblocks_those_behind_it() -> None:
    policy = GatePolicy(
        (ClassPolicy("interactive", 4, 0.05), ClassPolicy("batch", 4, 5.0)),
        max_requests=None,
        max_tokens=100,
    )
    g = PriorityGate("chat", policy)
    holder = await g.acquire("batch", 50)
    big = await queue(g, "interactive", 60)
    small = await queue(g, "batch", 10)
    with pytest.raises(Shed):
        await big
    await settle()
    granted(small).release()
    holder.release()
    assert g.in_flight_tokens == 0


async def test_retry_after_grows_with_the_queue_and_hold_time() -> None:
    clock = FakeClock()
    policy = GatePolicy(classes(max_queue=3), max_requests=2)
    g = PriorityGate("chat", policy, now=clock)
    holder = await g.acquire("batch", 0)
    holder2 = await g.acquire("batch", 0)
    waiters = [await queue(g, "batch") for _ in range(3)]
    with pytest.raises(Shed) as info:
        await g.acquire("batch", 0)
    assert info.value.retry_after_s == 1  # no hold-time history yet

    clock.advance(10.0)
    holder.release()  # one hold of 10 s; the first waiter takes the slot
    await settle()
    fill = await queue(g, "batch")
    with pytest.raises(Shed) as info:
        await g.acquire("batch", 0)
    # (3 waiting + 1) * 10 s / 2 slots
    assert info.value.retry_after_s == 20
    interactive_waiter = await queue(g, "interactive")
    with pytest.raises(Shed) as info:
        await g.acquire("batch", 0)
    assert info.value.retry_after_s == 25  # one more waiter of a higher class ahead

    clock.advance(1000.0)
    holder2.release()  # the mean jumps: the estimate is clamped to 60
    await settle()
    with pytest.raises(Shed) as info:
        await g.acquire("batch", 0)
    assert info.value.retry_after_s == 60

    await drain(interactive_waiter, *waiters, fill)
    assert (g.in_flight, g.queued) == (0, 0)


async def test_queued_s_is_measured_on_the_gate_clock() -> None:
    clock = FakeClock()
    g = PriorityGate("chat", GatePolicy(classes(), max_requests=1), now=clock)
    holder = await g.acquire("batch", 0)
    waiter = await queue(g, "batch")
    clock.advance(2.5)
    holder.release()
    await settle()
    assert granted(waiter).queued_s == 2.5
    granted(waiter).release()


async def test_snapshot_reports_depths_in_flight_and_capacities() -> None:
    g = gate(max_requests=4, max_tokens=1000, headroom=0.25, max_queued=10)
    slots = [await g.acquire("batch", 100) for _ in range(3)]
    waiter = await queue(g, "standard", 5)
    snapshot = g.snapshot()
    assert snapshot["name"] == "chat"
    assert (snapshot["in_flight"], snapshot["in_flight_tokens"], snapshot["queued"]) == (3, 300, 1)
    assert (snapshot["max_requests"], snapshot["max_tokens"]) == (4, 1000)
    assert (snapshot["headroom"], snapshot["max_queued"]) == (0.25, 10)
    assert list(snapshot["classes"]) == ["interactive", "standard", "batch"]
    standard = snapshot["classes"]["standard"]
    assert (standard["depth"], standard["max_requests"], standard["max_tokens"]) == (1, 3, 750)
    assert snapshot["classes"]["batch"]["admitted"] == 3
    for slot in slots:
        slot.release()
    await settle()
    granted(waiter).release()
    assert g.snapshot()["classes"]["standard"]["admitted"] == 1
