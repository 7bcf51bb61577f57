"""The usage log lane steering counts over a limit's window (sluicegate/lanes/usage.py)."""

from __future__ import annotations

import random

import pytest

from sluicegate.lanes import SLOTS, Usage, UsageLog


def test_a_charge_counts_for_its_window_then_leaves() -> None:
    log = UsageLog(60.0)
    log.add(100.0, 1, 10, 20)
    log.add(130.0, 1, 5, 0)
    assert log.usage(130.0) == Usage(2, 15, 20)
    assert log.usage(159.9) == Usage(2, 15, 20)
    assert log.usage(160.0) == Usage(1, 5, 0)  # the first left: counted while now < t + 60
    assert log.usage(190.0) == Usage(0, 0, 0)
    assert len(log) == 0


def test_every_kind_is_read_from_one_log() -> None:
    usage = Usage(requests=3, input_tokens=30, output_tokens=12)
    assert [usage.of(kind) for kind in ("requests", "tokens", "input_tokens", "output_tokens")] == [
        3,
        42,
        30,
        12,
    ]


def test_charges_close_together_share_an_entry_and_memory_stays_bounded() -> None:
    """A thousand records a second for two windows: entries start at least a slot apart
    and the oldest held ends inside the window, so at most SLOTS + 2 are held."""
    log = UsageLog(10.0)
    now = 0.0
    for _ in range(20_000):
        now += 0.001
        log.add(now, 1, 1, 1)
        assert len(log) <= SLOTS + 2
    # The last window holds 10,000 charges, plus at most one slot's worth counted late.
    assert 10_000 <= log.usage(now).requests <= 10_000 + 10_000 // SLOTS + 1


def test_a_shared_entry_leaves_with_its_newest_charge_never_early() -> None:
    log = UsageLog(100.0)  # slots of 1 s
    log.add(0.0, 1, 0, 0)
    log.add(0.9, 1, 0, 0)  # same entry
    assert len(log) == 1
    assert log.usage(100.5).requests == 2  # the first is 0.5 s past its window: still counted
    assert log.usage(100.9).requests == 0


@pytest.mark.parametrize("seed", range(5))
def test_the_running_totals_match_a_recount(seed: int) -> None:
    """Random charges and reads: the log's usage is every charge of the window, plus at
    most those of the slot just before it (module docstring)."""
    rng = random.Random(seed)
    window = 5.0
    log = UsageLog(window)
    charges: list[tuple[float, int]] = []
    now = 0.0
    for _ in range(3_000):
        now += rng.expovariate(50.0)
        if rng.random() < 0.7:
            amount = rng.randrange(1, 100)
            log.add(now, 1, amount, 0)
            charges.append((now, amount))
        else:
            read = log.usage(now)
            exact = sum(a for t, a in charges if t > now - window)
            late = sum(a for t, a in charges if t > now - window - window / SLOTS)
            assert exact <= read.input_tokens <= late
            counted = sum(1 for t, _ in charges if t > now - window)
            counted_late = sum(1 for t, _ in charges if t > now - window - window / SLOTS)
            assert counted <= read.requests <= counted_late


def test_a_longer_window_keeps_what_the_log_holds() -> None:
    log = UsageLog(10.0)
    log.add(0.0, 1, 0, 0)
    log.set_window(60.0)
    assert log.usage(30.0).requests == 1
    with pytest.raises(ValueError, match="positive"):
        log.set_window(0)


def test_a_clock_that_goes_back_never_reorders_the_log() -> None:
    log = UsageLog(10.0)
    log.add(50.0, 1, 0, 0)
    log.add(49.0, 1, 0, 0)  # taken as 50.0
    assert log.usage(59.9).requests == 2
    assert log.usage(60.0).requests == 0
