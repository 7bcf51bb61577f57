"""The mock's pacing: tokens are due from the request's arrival, on absolute deadlines."""

from __future__ import annotations

import asyncio
import random

import pytest

from sluicegate.provider import generation
from sluicegate.provider.generation import Pacer


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The sleeps the pacer asks for (none is taken: the test reads what was asked)."""
    asked: list[float] = []

    async def sleep(delay: float) -> None:
        asked.append(delay)

    monkeypatch.setattr(generation.asyncio, "sleep", sleep)
    return asked


async def test_the_first_token_is_due_a_ttft_after_the_request_arrived(
    waits: list[float],
) -> None:
    """Time the mock spent reading and parsing the body counts in its TTFT: a pacer made
    40 ms after its request arrived asks for only the rest of a 50 ms TTFT."""
    arrived = asyncio.get_running_loop().time() - 0.040
    pacer = Pacer(ttft_ms=50, itl_ms=5, jitter_ms=0, rng=random.Random(0), start=arrived)
    await pacer.next_token()
    [first] = waits
    assert 0 < first <= 0.010  # the 10 ms left, not 50 ms


async def test_a_pacer_past_its_deadlines_asks_for_no_wait(waits: list[float]) -> None:
    start = asyncio.get_running_loop().time() - 1
    pacer = Pacer(ttft_ms=5, itl_ms=5, jitter_ms=0, rng=random.Random(0), start=start)
    for _ in range(10):  # all ten tokens were due long ago
        await pacer.next_token()
    assert waits == []
