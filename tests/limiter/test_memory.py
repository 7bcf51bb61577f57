"""MemoryStore on a fake clock: the shared cases, exact to the microsecond, and more."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from sluicegate.filters.limiter import RETRY_WALK_CAP, Limit, MemoryStore, Usage

from .cases import CASES, LONG, NOTHING, Harness, limit, tokens


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    async def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(now=clock)


@pytest.fixture
def harness(store: MemoryStore, clock: FakeClock) -> Harness:
    return Harness(store=store, exact=True, short=1.0, advance=clock.advance, slack=0.0)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
async def test_shared_case(case: Callable[[Harness], Awaitable[None]], harness: Harness) -> None:
    await case(harness)


async def test_boundary_is_exact(harness: Harness, clock: FakeClock) -> None:
    """A charge at t counts in [t, t + window): any interval of one window holds the limit."""
    lim = limit("tokens", 10, 2.0)
    _, d = await harness.reserve([lim], tokens(10))
    assert d.admitted
    await clock.advance(2.0 - 1e-6)
    _, d = await harness.reserve([lim], tokens(1))
    assert not d.admitted and d.retry_after_s == pytest.approx(1e-6, abs=1e-9)
    assert d.states[0].reset_s == pytest.approx(1e-6, abs=1e-9)
    await clock.advance(1e-6)
    _, d = await harness.reserve([lim], tokens(10))
    assert d.admitted and d.states[0].used == 10


async def test_no_interval_admits_more_than_the_limit(harness: Harness, clock: FakeClock) -> None:
    """Rule "exact sliding window", against the 2x burst a bucket allows at a window edge."""
    lim = limit("requests", 5, 1.0)
    admitted_at: list[float] = []
    for _ in range(400):
        _, d = await harness.reserve([lim], NOTHING)
        if d.admitted:
            admitted_at.append(clock.t)
        await clock.advance(0.01)
    assert len(admitted_at) >= 5 * 3
    for start in admitted_at:
        inside = [t for t in admitted_at if start <= t < start + 1.0 - 1e-9]
        assert len(inside) <= 5


async def test_retry_walk_is_bounded(harness: Harness, clock: FakeClock) -> None:
    n = RETRY_WALK_CAP + 500
    lim = limit("tokens", n, 100.0)
    for _ in range(n):
        await harness.reserve([lim], tokens(1))
        await clock.advance(0.01)
    _, d = await harness.reserve([lim], tokens(RETRY_WALK_CAP + 200))
    # The fit is beyond the walk: the answer is one whole window, always enough.
    assert not d.admitted and d.retry_after_s == pytest.approx(100.0)
    _, d = await harness.reserve([lim], tokens(RETRY_WALK_CAP))
    assert d.retry_after_s == pytest.approx(100.0 - n * 0.01 + (RETRY_WALK_CAP - 1) * 0.01)


async def test_idle_keys_and_records_are_forgotten(store: MemoryStore, clock: FakeClock) -> None:
    for i in range(200):
        rid = f"r{i}"
        await store.reserve(rid, [Limit("key", f"k{i}", "tokens", 10, 1.0)], tokens(1))
    assert store.tracked_keys == 200 and store.tracked_reservations == 200
    await clock.advance(1.0)
    for i in range(300):
        await store.reserve(f"s{i}", [limit("tokens", 10**6)], tokens(1))
    assert store.tracked_keys == 1
    assert store.tracked_reservations == 300


async def test_a_reconcile_after_the_sweep_still_lands(
    store: MemoryStore, clock: FakeClock
) -> None:
    out = limit("output_tokens", 100, 10.0)
    await store.reserve("zero", [out], NOTHING)  # charges nothing: its log may be swept
    for i in range(100):
        await store.reserve(f"x{i}", [limit("tokens", 10**6, scope="key")], tokens(1))
    assert await store.reconcile("zero", Usage(0, 7))
    d = await store.reserve("probe", [out], NOTHING)
    assert d.states[0].used == 7 and d.states[0].reset_s == pytest.approx(10.0)


async def test_late_zero_estimate_keeps_time_order(store: MemoryStore, clock: FakeClock) -> None:
    lim = limit("output_tokens", 10, 10.0)
    await store.reserve("zero", [lim], NOTHING)
    await clock.advance(1.0)
    await store.reserve("later", [lim], Usage(0, 5))
    assert await store.reconcile("zero", Usage(0, 5))  # inserted before "later"
    d = await store.reserve("x", [lim], Usage(0, 5))
    assert not d.admitted and d.retry_after_s == pytest.approx(9.0)


def test_limit_validation() -> None:
    assert Limit("tenant", "acme", "tokens", 10, 60.0).key == "tenant:acme:tokens:60000"
    assert Limit("t", "a", "requests", 1, 0.3).window_ms == 300
    for bad in (
        dict(scope="", name="a", kind="tokens", limit=1, window_s=1.0),
        dict(scope="a:b", name="a", kind="tokens", limit=1, window_s=1.0),
        dict(scope="{a}", name="a", kind="tokens", limit=1, window_s=1.0),
        dict(scope="a", name="", kind="tokens", limit=1, window_s=1.0),
        dict(scope="a", name="a", kind="bytes", limit=1, window_s=1.0),
        dict(scope="a", name="a", kind="tokens", limit=0, window_s=1.0),
        dict(scope="a", name="a", kind="tokens", limit=True, window_s=1.0),
        dict(scope="a", name="a", kind="tokens", limit=1, window_s=0.0),
        dict(scope="a", name="a", kind="tokens", limit=1, window_s=float("inf")),
    ):
        with pytest.raises(ValueError):
            Limit(**bad)  # type: ignore[arg-type]


def test_usage_amounts() -> None:
    usage = Usage(3, 4)
    assert [usage.amount(k) for k in ("requests", "input_tokens", "output_tokens", "tokens")] == [
        1,
        3,
        4,
        7,
    ]
    with pytest.raises(ValueError):
        Usage(-1, 0)


async def test_empty_reservation_id_is_refused(store: MemoryStore) -> None:
    with pytest.raises(ValueError):
        await store.reserve("", [limit("tokens", 1, LONG)], NOTHING)
