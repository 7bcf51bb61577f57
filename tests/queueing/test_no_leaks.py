"""Randomized interleavings of arrivals, releases, cancellations, timeouts and reloads.

Whatever happens, the gate ends empty: nothing in flight, no tokens, no waiter.
"""

from __future__ import annotations

import asyncio
import random
from typing import NamedTuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.filters.queueing import ClassPolicy, GatePolicy, PriorityGate, Shed

NAMES = ("interactive", "standard", "batch")


def _policy(
    max_requests: int | None,
    max_tokens: int | None,
    headroom: float,
    max_queued: int | None,
    names: tuple[str, ...] = NAMES,
    max_queue: int = 3,
) -> GatePolicy:
    waits = {"interactive": 0.004, "standard": 0.002, "batch": 0.001, "bulk": 0.003}
    return GatePolicy(
        tuple(ClassPolicy(n, max_queue, waits[n]) for n in names),
        max_requests=max_requests,
        max_tokens=max_tokens,
        headroom=headroom,
        max_queued=max_queued,
    )


POLICIES = (
    _policy(2, 100, 0.0, None),
    _policy(3, 60, 0.34, 4),
    _policy(1, None, 0.0, 2, max_queue=1),
    _policy(4, 200, 0.5, None, names=("batch", "interactive")),  # reordered, standard removed
    _policy(2, 80, 0.25, 3, names=("interactive", "standard", "batch", "bulk")),
)
MOST_REQUESTS = 4


class Op(NamedTuple):
    kind: str  # arrive | cancel | tick | wait | reload
    priority: str = "standard"
    tokens: int = 0
    hold: int = 0  # loop steps a granted request holds its slot
    double_release: bool = False
    pick: int = 0  # which task to cancel / which policy to load


ops = st.one_of(
    st.builds(
        Op,
        st.just("arrive"),
        st.sampled_from((*NAMES, "bulk")),
        st.integers(0, 120),  # sometimes above every token capacity
        st.integers(0, 4),
        st.booleans(),
    ),
    st.builds(Op, st.just("cancel"), pick=st.integers(0, 10_000)),
    st.builds(Op, st.just("tick"), hold=st.integers(1, 3)),
    st.builds(Op, st.just("wait")),
    st.builds(Op, st.just("reload"), pick=st.integers(0, len(POLICIES) - 1)),
)


async def _run(script: list[Op]) -> None:
    gate = PriorityGate("chat", POLICIES[0])
    holding: dict[int, int] = {}  # client id -> tokens, while the client holds a slot
    tasks: list[asyncio.Task[None]] = []

    async def client(key: int, op: Op) -> None:
        slot = await gate.acquire(op.priority, op.tokens)
        holding[key] = op.tokens
        try:
            for _ in range(op.hold):
                await asyncio.sleep(0)
        finally:
            del holding[key]
            slot.release()
            if op.double_release:
                slot.release()

    for step, op in enumerate(script):
        if op.kind == "arrive":
            tasks.append(asyncio.create_task(client(step, op)))
        elif op.kind == "cancel" and tasks:
            tasks[op.pick % len(tasks)].cancel()
        elif op.kind == "tick":
            for _ in range(op.hold):
                await asyncio.sleep(0)
        elif op.kind == "wait":
            await asyncio.sleep(0.002)  # lets short deadlines fire
        elif op.kind == "reload":
            gate.update_policy(POLICIES[op.pick])
        # A grant not yet seen by its task counts in the gate but not in `holding`.
        assert gate.in_flight >= len(holding)
        assert gate.in_flight_tokens >= sum(holding.values())
        assert gate.in_flight <= MOST_REQUESTS
        # A reload sheds a removed class's waiters at once, so the current classes hold all.
        assert gate.queued == sum(gate.depth(c.name) for c in gate.policy.classes)

    if tasks:
        done, pending = await asyncio.wait(tasks, timeout=10)
        assert not pending
        for task in done:
            if not task.cancelled():
                error = task.exception()
                assert error is None or isinstance(error, Shed | ValueError), error
    await asyncio.sleep(0)
    assert holding == {}
    assert (gate.in_flight, gate.in_flight_tokens, gate.queued) == (0, 0, 0)
    assert all(gate.depth(c.name) == 0 for c in gate.policy.classes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=60))
def test_random_interleavings_leak_nothing(script: list[Op]) -> None:
    asyncio.run(_run(script))


def test_long_random_runs_leak_nothing() -> None:
    """Longer scripts than hypothesis builds, from fixed seeds (reproducible)."""
    for seed in range(10):
        rng = random.Random(seed)
        script: list[Op] = []
        for _ in range(400):
            roll = rng.random()
            if roll < 0.55:
                script.append(
                    Op(
                        "arrive",
                        rng.choice((*NAMES, "bulk")),
                        rng.randint(0, 120),
                        rng.randint(0, 6),
                        rng.random() < 0.2,
                    )
                )
            elif roll < 0.7:
                script.append(Op("cancel", pick=rng.randrange(10_000)))
            elif roll < 0.9:
                script.append(Op("tick", hold=rng.randint(1, 3)))
            elif roll < 0.97:
                script.append(Op("wait"))
            else:
                script.append(Op("reload", pick=rng.randrange(len(POLICIES))))
        asyncio.run(_run(script))
