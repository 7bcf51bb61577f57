"""Behaviour every LimiterStore must share, run against MemoryStore and RedisStore.

A Harness hides how time passes: a fake clock moved exactly (memory), or real
sleeps against Redis `TIME` (redis). Cases that need a window to pass use the
harness's short window; the others use a long one, so a slow machine cannot
make a charge leave early. Exact times are asserted only when the clock is fake.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from sluicegate.filters.limiter import (
    Decision,
    DuplicateReservation,
    Kind,
    Limit,
    LimiterStore,
    Usage,
)

LONG = 60.0
NOTHING = Usage(0, 0)


@dataclass
class Harness:
    store: LimiterStore
    exact: bool  # a fake clock: times can be asserted to the microsecond
    short: float  # a window the case may wait out
    advance: Callable[[float], Awaitable[None]]
    slack: float  # added to waits on a real clock
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def rid(self) -> str:
        return f"r{next(self._ids)}"

    async def reserve(self, limits: list[Limit], estimate: Usage) -> tuple[str, Decision]:
        rid = self.rid()
        return rid, await self.store.reserve(rid, limits, estimate)

    async def used(self, *limits: Limit) -> list[int]:
        """Totals now, read with a reservation that charges nothing (token kinds only)."""
        assert all(limit.kind != "requests" for limit in limits)
        _, decision = await self.reserve(list(limits), NOTHING)
        return [state.used for state in decision.states]

    async def wait(self, seconds: float) -> None:
        await self.advance(seconds + self.slack)

    def close_to(self, value: float | None, expected: float) -> bool:
        assert value is not None
        return value == pytest.approx(expected, abs=1e-6)


def limit(kind: Kind, amount: int, window_s: float = LONG, scope: str = "tenant") -> Limit:
    return Limit(scope, "acme", kind, amount, window_s)


def tokens(n: int) -> Usage:
    return Usage(n, 0)


# --- cases ---------------------------------------------------------------------------


async def window_admits_limit_then_refuses(h: Harness) -> None:
    lim = limit("requests", 3, h.short)
    for i in range(3):
        _, d = await h.reserve([lim], NOTHING)
        assert d.admitted and d.store_mode == "ok"
        assert (d.states[0].used, d.states[0].remaining) == (i + 1, 2 - i)
        assert d.states[0].reset_s == pytest.approx(h.short)  # the newest charge is now
    _, d = await h.reserve([lim], NOTHING)
    assert not d.admitted and d.refused_by == lim and d.requested == 1 and not d.too_large
    assert (d.states[0].used, d.states[0].remaining) == (3, 0)
    assert d.retry_after_s is not None and 0 < d.retry_after_s <= h.short
    await h.wait(h.short)
    _, d = await h.reserve([lim], NOTHING)
    assert d.admitted and d.states[0].used == 1


async def all_or_nothing_across_limits(h: Harness) -> None:
    a = limit("tokens", 100, scope="tenant")
    b = limit("tokens", 50, scope="key")
    c = limit("requests", 10, scope="model")
    _, d = await h.reserve([a, b, c], Usage(30, 10))
    assert d.admitted and [s.used for s in d.states] == [40, 40, 1]
    _, d = await h.reserve([a, b, c], Usage(15, 5))
    assert not d.admitted and d.refused_by == b and d.requested == 20 and not d.too_large
    assert [s.used for s in d.states] == [40, 40, 1]  # nothing written, not even on a
    assert [s.remaining for s in d.states] == [60, 10, 9]
    assert d.retry_after_s is not None and LONG - 5 < d.retry_after_s <= LONG
    _, d = await h.reserve([a, b, c], Usage(10, 0))
    assert d.admitted and [s.used for s in d.states] == [50, 50, 2]


async def too_large_is_checked_first(h: Harness) -> None:
    a = limit("tokens", 1000, scope="tenant")
    b = limit("tokens", 100, scope="key")
    c = limit("requests", 1, scope="model")
    _, d = await h.reserve([c], NOTHING)
    assert d.admitted
    # c has no room, but b can never hold this request: b is the answer.
    _, d = await h.reserve([a, c, b], tokens(150))
    assert not d.admitted and d.too_large and d.refused_by == b
    assert d.requested == 150 and d.retry_after_s is None
    assert [s.used for s in d.states] == [0, 1, 0]
    _, d = await h.reserve([a, b], tokens(100))  # exactly the limit fits
    assert d.admitted


async def retry_after_is_earliest_fit(h: Harness) -> None:
    w = h.short
    lim = limit("tokens", 10, w)
    await h.reserve([lim], tokens(4))
    await h.advance(0.2 * w)
    await h.reserve([lim], tokens(3))
    await h.advance(0.2 * w)
    await h.reserve([lim], tokens(3))
    _, d = await h.reserve([lim], tokens(5))
    # 4 leaving is not enough for 5 more; 4 + 3 is: the second charge decides.
    assert not d.admitted and d.retry_after_s is not None
    assert d.retry_after_s <= 0.8 * w + 1e-6
    if h.exact:
        assert h.close_to(d.retry_after_s, 0.8 * w)
        await h.advance(d.retry_after_s - 1e-6)
        _, early = await h.reserve([lim], tokens(5))
        assert not early.admitted
        await h.advance(1e-6)
    else:
        await h.wait(d.retry_after_s)
    _, d = await h.reserve([lim], tokens(5))
    assert d.admitted and d.states[0].used == 8


async def reconcile_refunds(h: Harness) -> None:
    lim = limit("tokens", 100)
    rid, d = await h.reserve([lim], Usage(50, 30))
    assert d.admitted
    _, d = await h.reserve([lim], Usage(20, 10))
    assert not d.admitted
    assert await h.store.reconcile(rid, Usage(15, 5))
    assert await h.used(lim) == [20]
    _, d = await h.reserve([lim], Usage(20, 10))
    assert d.admitted and d.states[0].used == 50


async def reconcile_charges_debt(h: Harness) -> None:
    lim = limit("tokens", 100, h.short)
    rid, _ = await h.reserve([lim], tokens(50))
    assert await h.store.reconcile(rid, Usage(120, 30))
    _, d = await h.reserve([lim], tokens(1))
    assert not d.admitted and d.refused_by == lim and not d.too_large
    assert (d.states[0].used, d.states[0].remaining) == (150, 0)
    assert d.retry_after_s is not None and 0 < d.retry_after_s <= h.short
    await h.wait(h.short)
    _, d = await h.reserve([lim], tokens(1))
    assert d.admitted and d.states[0].used == 1


async def reconcile_is_idempotent(h: Harness) -> None:
    lim = limit("tokens", 100)
    rid, _ = await h.reserve([lim], tokens(60))
    assert await h.store.reconcile(rid, tokens(10)) is True
    assert await h.store.reconcile(rid, tokens(90)) is False
    assert await h.used(lim) == [10]
    assert await h.store.reconcile("never-reserved", tokens(1)) is False
    assert await h.used(lim) == [10]


async def unreconciled_stays_charged_until_it_leaves(h: Harness) -> None:
    lim = limit("tokens", 100, h.short)
    rid, _ = await h.reserve([lim], tokens(100))
    _, d = await h.reserve([lim], tokens(1))
    assert not d.admitted
    await h.wait(h.short)
    _, d = await h.reserve([lim], tokens(100))
    assert d.admitted and d.states[0].used == 100
    assert await h.store.reconcile(rid, tokens(0)) is False  # expired with its window


async def requests_count_one_even_when_released(h: Harness) -> None:
    req = limit("requests", 2)
    tok = limit("tokens", 1000, scope="key")
    rid, d = await h.reserve([req, tok], Usage(300, 200))
    assert [s.used for s in d.states] == [1, 500]
    assert await h.store.reconcile(rid, NOTHING)  # released: never reached a provider
    _, d = await h.reserve([req, tok], NOTHING)
    assert d.admitted and [s.used for s in d.states] == [2, 0]
    _, d = await h.reserve([req, tok], NOTHING)
    assert not d.admitted and d.refused_by == req and d.requested == 1


async def reconcile_per_kind(h: Harness) -> None:
    inp = limit("input_tokens", 1000)
    out = limit("output_tokens", 1000)
    both = limit("tokens", 1000)
    rid, d = await h.reserve([inp, out, both], Usage(10, 100))
    assert [s.used for s in d.states] == [10, 100, 110]
    assert await h.store.reconcile(rid, Usage(12, 30))
    assert await h.used(inp, out, both) == [12, 30, 42]


async def zero_estimate_then_real_usage(h: Harness) -> None:
    out = limit("output_tokens", 100)
    rid, d = await h.reserve([out], Usage(5, 0))
    assert d.admitted and d.states[0].used == 0 and d.states[0].reset_s == 0
    assert await h.store.reconcile(rid, Usage(5, 40))
    _, d = await h.reserve([out], NOTHING)
    assert d.states[0].used == 40 and 0 < d.states[0].reset_s <= LONG


async def refund_to_zero_moves_reset(h: Harness) -> None:
    lim = limit("tokens", 100)
    await h.reserve([lim], tokens(30))
    await h.advance(1.0 if h.exact else 0.05)
    rid, d = await h.reserve([lim], tokens(20))
    assert d.states[0].reset_s == pytest.approx(LONG)
    assert await h.store.reconcile(rid, NOTHING)
    _, d = await h.reserve([lim], NOTHING)
    assert d.states[0].used == 30
    # The window now empties when the first charge leaves, not the refunded one.
    if h.exact:
        assert h.close_to(d.states[0].reset_s, LONG - 1.0)
    else:
        assert d.states[0].reset_s <= LONG - 0.05


async def reconcile_leaves_the_past_alone(h: Harness) -> None:
    short = limit("tokens", 100, h.short, scope="key")
    long = limit("tokens", 100, LONG)
    rid, _ = await h.reserve([short, long], tokens(50))
    await h.wait(h.short)
    assert await h.store.reconcile(rid, tokens(10))  # the long window still holds it
    assert await h.used(short, long) == [0, 10]


async def no_limits_admits(h: Harness) -> None:
    _, d = await h.reserve([], Usage(10**9, 10**9))
    assert d.admitted and d.states == () and d.refused_by is None


async def reservation_ids_are_unique(h: Harness) -> None:
    lim = limit("requests", 10)
    await h.store.reserve("same", [lim], NOTHING)
    with pytest.raises(DuplicateReservation):
        await h.store.reserve("same", [lim], NOTHING)
    with pytest.raises(ValueError, match="share one counter"):
        await h.store.reserve("other", [lim, limit("requests", 5)], NOTHING)


async def names_may_hold_separators(h: Harness) -> None:
    a = Limit("model", "llama3:8b", "tokens", 100, LONG)
    b = Limit("model", "llama3", "tokens", 100, LONG)
    rid, d = await h.reserve([a, b], tokens(30))
    assert d.admitted
    assert await h.store.reconcile(rid, tokens(40))
    assert await h.used(a, b) == [40, 40]
    _, d = await h.reserve([a], tokens(60))
    assert d.admitted and d.states[0].used == 100
    assert await h.used(b) == [40]


async def turned_away_request_gives_its_request_back(h: Harness) -> None:
    """Usage(0, 0, requests=0): a request the gateway shed never counts on the tenant."""
    lim = limit("requests", 2)
    shed, d = await h.reserve([lim], NOTHING)
    assert d.admitted
    assert await h.store.reconcile(shed, Usage(0, 0, 0))
    for _ in range(2):
        _, d = await h.reserve([lim], NOTHING)
        assert d.admitted
    _, d = await h.reserve([lim], NOTHING)
    assert not d.admitted


async def a_charge_goes_over_a_full_window(h: Harness) -> None:
    """A request admitted elsewhere (an auto tenant's fast-lane one) is charged on a full
    window, and again on one already over it: the next reserve is refused, and `used`
    shows every charge."""
    tok = limit("tokens", 100)
    req = limit("requests", 2, scope="key")
    _, d = await h.reserve([tok, req], tokens(100))
    assert d.admitted and [s.used for s in d.states] == [100, 1]
    assert await h.store.charge(h.rid(), [tok, req], Usage(30, 10))
    assert await h.store.charge(h.rid(), [tok, req], Usage(5, 0))
    _, d = await h.reserve([tok, req], NOTHING)
    assert not d.admitted and d.refused_by == tok and not d.too_large
    assert [s.used for s in d.states] == [145, 3]
    assert [s.remaining for s in d.states] == [0, 0]
    assert d.retry_after_s is not None and 0 < d.retry_after_s <= LONG


async def a_charge_counts_each_kind_and_leaves_with_its_window(h: Harness) -> None:
    inp = limit("input_tokens", 10, h.short)
    out = limit("output_tokens", 10, h.short)
    both = limit("tokens", 10, h.short)
    req = limit("requests", 1, h.short)
    charge_id = h.rid()
    assert await h.store.charge(charge_id, [inp, out, both, req], Usage(25, 0))
    _, d = await h.reserve([inp, out, both, req], NOTHING)
    assert not d.admitted and d.refused_by == inp
    assert [s.used for s in d.states] == [25, 0, 25, 1]
    assert 0 < d.states[0].reset_s <= h.short
    assert d.states[1].reset_s == 0  # a zero charge is not written
    await h.wait(h.short)
    _, d = await h.reserve([inp, out, both, req], Usage(10, 0))
    assert d.admitted and [s.used for s in d.states] == [10, 0, 10, 1]


async def a_charge_id_is_used_once(h: Harness) -> None:
    """Whatever the second charge's amount (Redis once told charges apart by their log
    member, which names the amount, and took the same id again with another)."""
    lim = limit("tokens", 100)
    req = limit("requests", 5, scope="key")
    assert await h.store.charge("c", [lim, req], tokens(10))
    for usage in (tokens(10), tokens(11), NOTHING):
        with pytest.raises(DuplicateReservation):
            await h.store.charge("c", [lim, req], usage)
        with pytest.raises(DuplicateReservation):
            await h.store.charge("c", [lim], usage)
    with pytest.raises(ValueError, match="share one counter"):
        await h.store.charge("d", [lim, limit("tokens", 5)], tokens(1))
    assert await h.store.charge("e", [], tokens(10))
    _, d = await h.reserve([lim, req], NOTHING)
    assert [s.used for s in d.states] == [10, 2]  # the charge and this reserve's request


async def a_charge_is_reconciled_in_place(h: Harness) -> None:
    """A running request charged its estimate (its first in-flight record), replaced once
    by its real usage (its end record): at the charge's own time, so it leaves the
    window when the estimate would have."""
    short = limit("tokens", 100, h.short)
    long = limit("tokens", 100, LONG, scope="key")
    assert await h.store.charge("s", [short, long], tokens(60))
    assert await h.used(short, long) == [60, 60]
    await h.advance(0.5 * h.short)
    assert await h.store.reconcile("s", Usage(120, 30)) is True  # more than the limit: debt
    assert await h.used(short, long) == [150, 150]
    assert await h.store.reconcile("s", tokens(10)) is False  # once, as a reservation
    assert await h.used(short, long) == [150, 150]
    await h.wait(0.5 * h.short)
    assert await h.used(short, long) == [0, 150]


async def a_charge_is_lowered_or_released(h: Harness) -> None:
    tok = limit("tokens", 100)
    req = limit("requests", 1, scope="key")
    assert await h.store.charge("a", [tok, req], Usage(50, 30))
    _, d = await h.reserve([tok, req], NOTHING)
    assert not d.admitted and d.refused_by == req and [s.used for s in d.states] == [80, 1]
    assert await h.store.reconcile("a", Usage(10, 5))
    _, d = await h.reserve([tok, req], NOTHING)
    assert not d.admitted and [s.used for s in d.states] == [15, 1]
    # A request that failed: its request given back too.
    only = limit("requests", 1, scope="model")
    assert await h.store.charge("f", [only], NOTHING)
    _, d = await h.reserve([only], NOTHING)
    assert not d.admitted and d.states[0].used == 1
    assert await h.store.reconcile("f", Usage(0, 0, requests=0))
    _, d = await h.reserve([only], NOTHING)
    assert d.admitted and d.states[0].used == 1
    assert await h.store.reconcile("never-charged", Usage(0, 0, requests=0)) is False


async def a_charge_id_stays_in_use_after_its_reconcile(h: Harness) -> None:
    """A stream's later in-flight records (another replica's too) change nothing: before
    its end, after it, and when the charge put nothing in any log (only its record)."""
    tok = limit("tokens", 100)
    req = limit("requests", 5, scope="key")
    assert await h.store.charge("z", [tok], NOTHING)  # 0 tokens: no entry
    for usage in (NOTHING, tokens(7)):
        with pytest.raises(DuplicateReservation):
            await h.store.charge("z", [tok], usage)
    assert await h.used(tok) == [0]
    assert await h.store.charge("s", [tok, req], tokens(40))
    with pytest.raises(DuplicateReservation):
        await h.store.charge("s", [tok, req], tokens(90))
    assert await h.used(tok) == [40]
    assert await h.store.reconcile("s", Usage(0, 0, requests=0))  # it failed
    with pytest.raises(DuplicateReservation):
        await h.store.charge("s", [tok, req], tokens(40))  # a late one
    _, d = await h.reserve([tok, req], NOTHING)
    assert [s.used for s in d.states] == [0, 1]  # this reserve's request alone
    assert await h.store.reconcile("z", tokens(3))  # from nothing to its real usage
    assert await h.used(tok) == [3]


CASES: list[Callable[[Harness], Awaitable[None]]] = [
    a_charge_is_reconciled_in_place,
    a_charge_is_lowered_or_released,
    a_charge_id_stays_in_use_after_its_reconcile,
    a_charge_goes_over_a_full_window,
    a_charge_counts_each_kind_and_leaves_with_its_window,
    a_charge_id_is_used_once,
    turned_away_request_gives_its_request_back,
    window_admits_limit_then_refuses,
    all_or_nothing_across_limits,
    too_large_is_checked_first,
    retry_after_is_earliest_fit,
    reconcile_refunds,
    reconcile_charges_debt,
    reconcile_is_idempotent,
    unreconciled_stays_charged_until_it_leaves,
    requests_count_one_even_when_released,
    reconcile_per_kind,
    zero_estimate_then_real_usage,
    refund_to_zero_moves_reset,
    reconcile_leaves_the_past_alone,
    no_limits_admits,
    reservation_ids_are_unique,
    names_may_hold_separators,
]
