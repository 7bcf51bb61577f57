"""Policy validation, per-class capacities and the Retry-After estimate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.filters.queueing import (
    Capacity,
    ClassPolicy,
    GatePolicy,
    HoldTimes,
    class_capacity,
    retry_after_s,
)

from .helpers import classes


@pytest.mark.parametrize(
    ("max_requests", "max_tokens", "headroom", "lower"),
    [
        (4, None, 0.25, Capacity(3, None)),  # batch+standard hold 3, 1 kept for interactive
        (4, 1000, 0.0, Capacity(4, 1000)),
        (1, 10, 0.5, Capacity(1, 5)),  # at least 1 request
        (10, 10, 0.9, Capacity(1, 1)),  # 10 * 0.1 is 0.999... in floats; still 1
        (10, 100, 0.7, Capacity(3, 30)),
        (None, None, 0.5, Capacity(None, None)),
        (3, 7, 0.99, Capacity(1, 1)),
    ],
)
def test_lower_classes_leave_headroom(
    max_requests: int | None, max_tokens: int | None, headroom: float, lower: Capacity
) -> None:
    policy = GatePolicy(classes(), max_requests, max_tokens, headroom)
    assert class_capacity(policy, 0) == Capacity(max_requests, max_tokens)
    assert class_capacity(policy, 1) == lower
    assert class_capacity(policy, 2) == lower


@pytest.mark.parametrize(
    "make",
    [
        lambda: ClassPolicy("", 1, 1.0),
        lambda: ClassPolicy("batch", -1, 1.0),
        lambda: ClassPolicy("batch", 1, 0.0),
        lambda: ClassPolicy("batch", 1, float("inf")),
        lambda: ClassPolicy("batch", True, 1.0),
        lambda: GatePolicy(()),
        lambda: GatePolicy(classes(), max_requests=0),
        lambda: GatePolicy(classes(), max_tokens=-5),
        lambda: GatePolicy(classes(), headroom=1.0),
        lambda: GatePolicy(classes(), headroom=-0.1),
        lambda: GatePolicy(classes(), max_queued=-1),
        lambda: GatePolicy((ClassPolicy("a", 1, 1.0), ClassPolicy("a", 2, 1.0))),
    ],
)
def test_bad_policies_are_refused(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_class_index() -> None:
    policy = GatePolicy(classes())
    assert [policy.index(n) for n in ("interactive", "standard", "batch")] == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown priority class 'bulk'"):
        policy.index("bulk")


def test_retry_after_without_history_is_one_second() -> None:
    assert retry_after_s(100, None, 1) == 1


@pytest.mark.parametrize(
    ("ahead", "hold", "concurrency", "expected"),
    [
        (0, 0.5, 4, 1),  # rounds up to the 1 s floor
        (3, 2.0, 4, 2),  # 4 * 2 / 4
        (4, 2.0, 4, 3),  # 5 * 2 / 4 = 2.5 -> 3
        (10_000, 30.0, 1, 60),  # clamped
    ],
)
def test_retry_after_estimate(ahead: int, hold: float, concurrency: int, expected: int) -> None:
    assert retry_after_s(ahead, hold, concurrency) == expected


@given(
    ahead=st.integers(min_value=0, max_value=10**9),
    hold=st.one_of(st.none(), st.floats(min_value=0, max_value=1e300)),
    concurrency=st.integers(min_value=0, max_value=10**6),
)
def test_retry_after_is_a_whole_second_count_in_bounds(
    ahead: int, hold: float | None, concurrency: int
) -> None:
    value = retry_after_s(ahead, hold, concurrency)
    assert isinstance(value, int)
    assert 1 <= value <= 60


def test_hold_times_follow_recent_releases() -> None:
    holds = HoldTimes(alpha=0.5)
    assert holds.mean_s is None
    holds.add(4.0)
    assert holds.mean_s == 4.0
    holds.add(2.0)
    assert holds.mean_s == 3.0
    holds.add(-1.0)  # a clock step backwards counts as 0
    assert holds.mean_s == 1.5
