"""Overload simulation: interactive traffic rides through while batch is shed."""

from __future__ import annotations

import asyncio

from sluicegate.filters.queueing import ClassPolicy, GatePolicy, PriorityGate, Shed

INTERACTIVE_MAX_WAIT_S = 0.5
SERVICE_S = 0.01  # fake upstream time per request
TICK_S = 0.005


async def test_overload_sheds_batch_and_keeps_interactive_within_its_max_wait() -> None:
    policy = GatePolicy(
        (
            ClassPolicy("interactive", max_queue=32, max_wait_s=INTERACTIVE_MAX_WAIT_S),
            ClassPolicy("batch", max_queue=8, max_wait_s=0.05),
        ),
        max_requests=4,
        headroom=0.25,
    )
    gate = PriorityGate("chat", policy)
    queued: dict[str, list[float]] = {"interactive": [], "batch": []}
    shed: dict[str, list[Shed]] = {"interactive": [], "batch": []}
    peak = 0

    async def request(priority: str) -> None:
        nonlocal peak
        try:
            slot = await gate.acquire(priority, 100)
        except Shed as error:
            shed[priority].append(error)
            return
        peak = max(peak, gate.in_flight)
        try:
            await asyncio.sleep(SERVICE_S)
        finally:
            slot.release()
        queued[priority].append(slot.queued_s)

    # Interactive asks for ~2 of the 4 slots; batch asks for ~10 more.
    tasks = []
    for _ in range(40):
        tasks.append(asyncio.create_task(request("interactive")))
        tasks.extend(asyncio.create_task(request("batch")) for _ in range(5))
        await asyncio.sleep(TICK_S)
    await asyncio.gather(*tasks)

    assert shed["interactive"] == []
    assert len(queued["interactive"]) == 40
    assert max(queued["interactive"]) <= INTERACTIVE_MAX_WAIT_S
    assert shed["batch"], "an overload this size must shed batch"
    assert {error.reason for error in shed["batch"]} <= {"queue_full", "queue_timeout"}
    assert all(1 <= error.retry_after_s <= 60 for error in shed["batch"])
    assert queued["batch"], "batch still gets the capacity interactive leaves"
    assert peak <= 4
    assert (gate.in_flight, gate.in_flight_tokens, gate.queued) == (0, 0, 0)
