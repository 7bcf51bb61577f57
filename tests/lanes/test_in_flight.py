"""A long request counted while it runs (docs/fast-lane.md, "The auto lane"): its first
record sent while it runs counts its estimate at once, its end record replaces that by
what it was billed, in place."""

from __future__ import annotations

from sluicegate.lanes import LaneSteering
from tests.latency.helpers import Clock

from .helpers import gateway, record

RUNNING = {"stream_id": "req-1", "estimate_input": 100, "estimate_output": 500}


def steering() -> tuple[LaneSteering, Clock]:
    clock = Clock()
    lanes = LaneSteering(clock=clock)
    lanes.load(gateway())
    return lanes, clock


def used(lanes: LaneSteering) -> list[tuple[str | None, str, int]]:
    return [(u.key, u.kind, u.used) for u in lanes.report()["acme"].limits]


def test_a_running_request_is_counted_once_at_its_estimate_then_at_what_it_was_billed() -> None:
    lanes, clock = steering()
    assert lanes.observe(record(in_flight=True, input_tokens=None, output_tokens=None, **RUNNING))
    assert used(lanes) == [(None, "requests", 1), ("ci", "tokens", 600)]
    # Envoy sends one every half second while it runs: counted once.
    clock.now += 0.5
    assert not lanes.observe(record(in_flight=True, **RUNNING))
    assert used(lanes) == [(None, "requests", 1), ("ci", "tokens", 600)]
    # Its end: the estimate becomes its usage, at the time it was first counted.
    clock.now += 5
    assert lanes.observe(record(input_tokens=30, output_tokens=20, **RUNNING))
    assert used(lanes) == [(None, "requests", 1), ("ci", "tokens", 50)]
    clock.now = 1000.0 + 10.0  # ci's window (10 s) from when it was first counted
    assert used(lanes) == [(None, "requests", 1), ("ci", "tokens", 0)]


def test_a_running_request_that_fails_gives_back_what_it_was_counted() -> None:
    lanes, _ = steering()
    lanes.observe(record(in_flight=True, **RUNNING))
    assert lanes.observe(record(status=503, input_tokens=None, output_tokens=None, **RUNNING))
    assert used(lanes) == [(None, "requests", 0), ("ci", "tokens", 0)]


def test_a_long_request_moves_its_tenant_before_it_ends() -> None:
    """Six requests of ten still running: the tenant is moved now, not when they end."""
    lanes, _ = steering()
    for n in range(5):
        lanes.observe(record(in_flight=True, stream_id=f"req-{n}"))
    [move] = lanes.tick()
    assert move.to_lane == "exact"


def test_an_end_whose_running_record_was_never_seen_counts_as_ever() -> None:
    """A short request (its end before Envoy's first record while it runs)."""
    lanes, _ = steering()
    assert lanes.observe(record(input_tokens=30, output_tokens=20, **RUNNING))
    assert used(lanes) == [(None, "requests", 1), ("ci", "tokens", 50)]


def test_a_running_record_after_its_end_counts_nothing() -> None:
    """Its running records come by the lane log, its end by the record log, each flushed
    on its own (record_log.py), through any ext_proc server: the end may come first."""
    lanes, _ = steering()
    assert lanes.observe(record(input_tokens=30, output_tokens=20, **RUNNING))
    assert not lanes.observe(record(in_flight=True, **RUNNING))
    assert used(lanes) == [(None, "requests", 1), ("ci", "tokens", 50)]


def test_two_tenants_requests_with_one_id_are_two_requests() -> None:
    """Ids are kept per tenant: one tenant's end never settles another's running request."""
    lanes, _ = steering()
    lanes.observe(record(in_flight=True, **RUNNING))
    assert lanes.observe(record("solo", "solo-key", input_tokens=1, output_tokens=1, **RUNNING))
    assert used(lanes) == [(None, "requests", 1), ("ci", "tokens", 600)]
