"""Lane steering of `auto` tenants from their records (sluicegate/lanes/steering.py): a
hand clock, records built by hand, no Envoy."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate import config
from sluicegate.lanes import AutoLaneSettings, LaneMove, LaneSteering
from tests.latency.helpers import Clock

from .helpers import document, gateway, record, tenant_doc


def steering(
    settings: AutoLaneSettings | None = None, doc: Any = None
) -> tuple[LaneSteering, Clock]:
    """Steering of `doc` (the helpers' model by default), its thresholds `settings`
    declared in `admission.auto_lane` as a user would (load reads them there)."""
    clock = Clock()
    lanes = LaneSteering(clock=clock)
    if settings is not None:
        doc = doc or document()
        doc.setdefault("admission", {})["auto_lane"] = {
            "exact_above": settings.exact_above,
            "fast_below": settings.fast_below,
            "hold": f"{settings.hold_s:g}s",
        }
    lanes.load(gateway(doc))
    return lanes, clock


def send(lanes: LaneSteering, count: int, **fields: Any) -> None:
    for _ in range(count):
        assert lanes.observe(record(**fields))


def test_auto_tenants_start_in_the_fast_lane_and_stay_there_while_idle() -> None:
    lanes, clock = steering()
    assert lanes.lanes() == {"acme": "fast", "solo": "fast"}  # `fixed` is not auto
    assert lanes.tick() == []
    clock.now += 3600
    assert lanes.tick() == []
    report = lanes.report()
    assert report["acme"].lane == "fast" and report["acme"].since_s == 3600
    assert [(u.key, u.kind, u.limit, u.window_s, u.used) for u in report["acme"].limits] == [
        (None, "requests", 10, 60.0, 0),
        ("ci", "tokens", 1000, 10.0, 0),
    ]


def test_half_a_limit_moves_a_tenant_to_the_exact_lane_once() -> None:
    lanes, clock = steering()
    send(lanes, 4, key_name="ops")  # 40% of 10 requests a minute
    assert lanes.tick() == []
    send(lanes, 1, key_name="ops")  # 50%
    clock.now += 0.1
    [move] = lanes.tick()
    assert (move.tenant, move.from_lane, move.to_lane) == ("acme", "fast", "exact")
    assert move.limit is not None
    assert (move.limit.key, move.limit.kind, move.limit.used, move.limit.fraction) == (
        None,
        "requests",
        5,
        0.5,
    )
    assert lanes.lanes() == {"acme": "exact", "solo": "fast"}
    assert lanes.tick() == []  # idempotent
    assert lanes.report()["acme"].moves == 1


def test_a_quarter_of_every_limit_after_the_hold_moves_it_back() -> None:
    lanes, clock = steering()
    send(lanes, 5, key_name="ops")
    lanes.tick()
    clock.now += 30
    send(lanes, 2, key_name="ops")
    clock.now += 30  # the first five left: 2 of 10 (20%)
    [move] = lanes.tick()
    assert (move.from_lane, move.to_lane) == ("exact", "fast")
    assert move.limit is not None and move.limit.fraction == 0.2
    assert lanes.lanes()["acme"] == "fast"
    assert lanes.report()["acme"].moves == 2 and lanes.report()["acme"].since_s == 0


def test_between_the_thresholds_a_tenant_stays_where_it_is() -> None:
    """Hysteresis: 30% moves nobody, whichever lane the tenant is in."""
    lanes, clock = steering()
    send(lanes, 3, key_name="ops")
    assert lanes.tick() == []  # 30% in the fast lane
    send(lanes, 2, key_name="ops")
    assert [m.to_lane for m in lanes.tick()] == ["exact"]
    clock.now += 30
    send(lanes, 3, key_name="ops")
    for _ in range(10):
        clock.now += 5  # from 60 s on, 3 of 10 (30%), for 20 s
        assert lanes.tick() == []
    assert lanes.lanes()["acme"] == "exact"


def test_the_exact_lane_is_held_for_hold_s_even_when_usage_falls() -> None:
    lanes, clock = steering(AutoLaneSettings(hold_s=30), doc=None)
    send(lanes, 1, tenant="acme", key_name="ci", input_tokens=300, output_tokens=300)
    [move] = lanes.tick()  # 600 of 1,000 tokens per 10 s
    assert move.limit is not None and move.limit.key == "ci"
    clock.now += 11
    assert lanes.report()["acme"].limits[1].used == 0
    assert lanes.tick() == []  # usage gone, hold not over
    clock.now += 18.9
    assert lanes.tick() == []
    clock.now += 0.1
    assert [m.to_lane for m in lanes.tick()] == ["fast"]


@pytest.mark.parametrize(
    ("kind", "half"),
    [("requests", 2), ("tokens", 100), ("input_tokens", 60), ("output_tokens", 40)],
)
def test_each_kind_of_limit_counts_its_own_amount(kind: str, half: int) -> None:
    """One record of 30 input and 20 output tokens is 1 request, 50 tokens, 30 in, 20 out:
    exactly half of `half`'s limit moves the tenant, one more unit of limit does not."""
    for limit, moves in ((half, True), (half + 1, False)):
        doc = document()
        tenant_doc(doc, "acme")["rate_limits"] = {kind: limit, "per": "1m"}
        lanes, _ = steering(doc=doc)
        send(lanes, 1, key_name="ops", input_tokens=30, output_tokens=20)
        made = lanes.tick()
        assert bool(made) is moves, (kind, limit)
        if made:
            assert made[0].limit is not None and made[0].limit.kind == kind


def test_a_key_limit_counts_only_that_key_s_records() -> None:
    lanes, _ = steering()
    send(lanes, 1, key_name="ops", input_tokens=300, output_tokens=300)
    assert lanes.tick() == []  # ops has no limits; acme's own: 1 request of 10
    send(lanes, 1, key_name="ci", input_tokens=250, output_tokens=250)
    [move] = lanes.tick()
    assert move.limit is not None
    assert (move.limit.key, move.limit.kind, move.limit.used) == ("ci", "tokens", 500)


def test_a_tenant_with_only_key_limits_counts_records_of_those_keys() -> None:
    lanes, _ = steering()
    assert not lanes.observe(record("solo", "", input_tokens=100))  # no key: nothing to count
    assert lanes.observe(record("solo", "solo-key", input_tokens=50))
    [move] = lanes.tick()
    assert (move.tenant, move.to_lane) == ("solo", "exact")
    assert move.limit is not None and move.limit.kind == "input_tokens"


@pytest.mark.parametrize(
    "failed",
    [
        {"status": 500, "input_tokens": None, "output_tokens": None},
        {"status": 429, "input_tokens": None, "output_tokens": None},
        {"status": 400, "input_tokens": None, "output_tokens": None},
        {"status": 0, "input_tokens": None, "output_tokens": None},  # the client left first
    ],
)
def test_a_failed_request_counts_for_nothing(failed: dict[str, Any]) -> None:
    lanes, _ = steering()
    for _ in range(20):
        assert not lanes.observe(record(key_name="ci", estimate_input=400, **failed))
    assert lanes.records_counted == 0
    assert lanes.tick() == []
    assert all(usage.used == 0 for usage in lanes.report()["acme"].limits)


def test_records_of_other_tenants_are_ignored() -> None:
    lanes, _ = steering()
    for tenant in ("fixed", "nobody", ""):
        for _ in range(20):
            assert not lanes.observe(record(tenant, "fixed-key"))
    assert lanes.records_counted == 0
    assert lanes.tick() == []
    assert lanes.lanes() == {"acme": "fast", "solo": "fast"}


def test_a_stream_without_usage_counts_its_events_and_json_its_estimate() -> None:
    lanes, _ = steering()
    stream = record(
        key_name="ci",
        stream=True,
        input_tokens=None,
        output_tokens=None,
        content_events=7,
        estimate_input=12,
        estimate_output=900,
    )
    assert lanes.observe(stream)
    assert lanes.report()["acme"].limits[1].used == 19  # 12 in, 7 events; not the 900 allowed
    plain = record(
        key_name="ci", input_tokens=None, output_tokens=None, estimate_input=5, estimate_output=8
    )
    assert lanes.observe(plain)
    assert lanes.report()["acme"].limits[1].used == 19 + 13
    assert lanes.records_counted == 2


def test_a_reload_keeps_lanes_and_usage_of_tenants_still_auto() -> None:
    lanes, clock = steering()
    send(lanes, 5, key_name="ops")
    lanes.tick()
    clock.now += 5
    doc = document()
    tenant_doc(doc, "acme")["rate_limits"] = {"requests": 15, "per": "2m"}  # changed limit
    tenant_doc(doc, "solo")["lane"] = "fast"  # no longer auto: forgotten
    doc["tenants"].append({"name": "newbie", "lane": "auto", "rate_limits": {"requests": 2}})
    lanes.load(gateway(doc))
    assert lanes.lanes() == {"acme": "exact", "newbie": "fast"}
    acme = lanes.report()["acme"]
    assert acme.since_s == 5 and acme.moves == 1
    assert [(u.kind, u.limit, u.window_s, u.used) for u in acme.limits[:1]] == [
        ("requests", 15, 120.0, 5)
    ]
    clock.now += 60  # past the old window, inside the new one
    assert lanes.report()["acme"].limits[0].used == 5
    assert lanes.tick() == []  # a third of 15: still exact (forgotten, it would move back)
    assert not lanes.observe(record("solo", "solo-key"))
    # Auto again: a new tenant, in the fast lane with nothing counted.
    lanes.load(gateway())
    assert lanes.report()["solo"].limits[0].used == 0 and lanes.lanes()["solo"] == "fast"


def test_a_tenant_whose_limits_are_removed_returns_to_the_fast_lane() -> None:
    lanes, clock = steering()
    send(lanes, 5, key_name="ops")
    lanes.tick()
    doc = document()
    acme = tenant_doc(doc, "acme")
    acme["rate_limits"] = None
    acme["keys"][0]["rate_limits"] = None
    lanes.load(gateway(doc))
    assert not lanes.observe(record(key_name="ci"))  # nothing to count into
    clock.now += 10
    [move] = lanes.tick()
    assert move.to_lane == "fast" and move.limit is None
    assert move.describe() == "tenant acme: auto lane exact -> fast: no limits left"


def test_a_window_slides() -> None:
    lanes, clock = steering()
    for _ in range(4):
        send(lanes, 1, key_name="ops")
        clock.now += 20
    # Requests at 0, 20, 40, 60: at 80 the first two are 80 and 60 s old.
    assert lanes.report()["acme"].limits[0].used == 2
    send(lanes, 2, key_name="ops")
    assert lanes.tick() == []  # 4 of 10
    send(lanes, 1, key_name="ops")
    assert [m.to_lane for m in lanes.tick()] == ["exact"]


def test_a_tenant_pushing_3x_its_limit_moves_once_and_stays_exact() -> None:
    """acme sends 30 requests a minute against its 10 (one every 2 s) for 10 minutes. The
    fast lane admits by a token bucket (10, refilled 10 a minute), the exact lane by a
    sliding window of what both lanes admitted; a refused request is a 429. Records reach
    steering 0.5 s after their request, and steering ticks every 0.1 s."""
    lanes, clock = steering()
    start = clock.now
    bucket, refilled = 10.0, start
    admitted: list[float] = []
    pending: list[tuple[float, int]] = []
    moves: list[LaneMove] = []
    lane_after_move: set[str] = set()
    next_request = start
    for step in range(1, 6000 + 1):
        clock.now = start + step * 0.1
        if clock.now >= next_request:
            next_request += 2.0
            if lanes.lanes()["acme"] == config.LANE_FAST:
                bucket = min(10.0, bucket + (clock.now - refilled) * 10 / 60)
                refilled = clock.now
                ok = bucket >= 1
                bucket -= ok
            else:
                ok = sum(1 for t in admitted if t > clock.now - 60) < 10
            if ok:
                admitted.append(clock.now)
            pending.append((clock.now + 0.5, 200 if ok else 429))
        for due, status in [item for item in pending if item[0] <= clock.now]:
            pending.remove((due, status))
            tokens = None if status == 429 else 10
            lanes.observe(
                record(key_name="ops", status=status, input_tokens=tokens, output_tokens=tokens)
            )
        moves.extend(lanes.tick())
        if moves:
            lane_after_move.add(lanes.lanes()["acme"])
    assert [(m.from_lane, m.to_lane) for m in moves] == [("fast", "exact")]
    assert lane_after_move == {"exact"}
    assert moves[0].limit is not None and moves[0].limit.kind == "requests"
    assert len(admitted) >= 90  # it kept being admitted at its limit, in the exact lane
    # Moved in time: no window of 60 s admitted more than 1.1x the limit (issue 12).
    assert max(sum(1 for t in admitted if s <= t < s + 60) for s in admitted) <= 11


def test_a_move_s_log_line_names_the_limit_and_never_a_key() -> None:
    lanes, _ = steering()
    send(lanes, 1, key_name="ci", input_tokens=400, output_tokens=120)
    [move] = lanes.tick()
    line = move.describe()
    assert line == (
        "tenant acme: auto lane fast -> exact: key ci's tokens 520/1000 per 10s (52%) >= 50%"
    )
    assert "sha256" not in line


@pytest.mark.parametrize(
    "values",
    [
        {"exact_above": 0.3, "fast_below": 0.3},
        {"exact_above": 1.5},
        {"fast_below": 0},
        {"fast_below": -0.1},
        {"hold_s": -1},
        {"tick_s": 0},
        {"exact_above": float("nan")},
    ],
)
def test_settings_are_validated(values: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="auto lane"):
        AutoLaneSettings(**values)


def test_thresholds_can_be_set() -> None:
    lanes, clock = steering(AutoLaneSettings(exact_above=0.8, fast_below=0.5, hold_s=0))
    send(lanes, 7, key_name="ops")
    assert lanes.tick() == []
    send(lanes, 1, key_name="ops")
    assert [m.to_lane for m in lanes.tick()] == ["exact"]
    clock.now += 60
    assert [m.to_lane for m in lanes.tick()] == ["fast"]


def test_a_refusal_by_the_fast_lane_s_buckets_moves_the_tenant_to_the_exact_lane() -> None:
    """The buckets charge a request's estimate, which may run far above what it is billed:
    a tenant they refuse is moved however little its windows hold, and the exact lane
    admits it by what it is billed. A provider's own 429 moves nobody."""
    lanes, _ = steering()
    provider_429 = record(status=429, input_tokens=None, output_tokens=None, fast_lane=True,
                          code_details="via_upstream")  # fmt: skip
    assert not lanes.observe(provider_429)
    assert lanes.tick() == []
    refused = record(status=429, input_tokens=None, output_tokens=None, fast_lane=True,
                     code_details="local_rate_limited")  # fmt: skip
    assert not lanes.observe(refused)  # counts nothing
    [move] = lanes.tick()
    assert (move.to_lane, move.refused) == ("exact", True)
    assert "token buckets refused" in move.describe()
    assert lanes.report()["acme"].limits[0].used == 0
    # In the exact lane, a refusal there (the routing stage's) changes nothing.
    lanes.observe(refused)
    assert lanes.tick() == []


def test_a_tenant_moved_by_refusals_waits_longer_each_time_before_it_returns() -> None:
    """A tenant whose estimates outgrow its buckets is refused at each return: its hold
    doubles per refusal-made move in a row, so it does not flap every hold."""
    doc = document()
    doc["admission"] = {"auto_lane": {"hold": "10s"}}
    lanes, clock = steering(doc=doc)
    refused = record(status=429, input_tokens=None, output_tokens=None, fast_lane=True,
                     code_details="local_rate_limited")  # fmt: skip
    back_after = []
    for _ in range(3):
        lanes.observe(refused)
        [move] = lanes.tick()
        assert move.refused
        moved = clock.now
        while not lanes.tick():
            clock.now += 1
        back_after.append(clock.now - moved)
    assert back_after == [20, 40, 80]
    # A whole longest window (60 s) in the fast lane unrefused forgets the count.
    clock.now += 60
    assert lanes.tick() == []
    lanes.observe(refused)
    lanes.tick()
    moved = clock.now
    while not lanes.tick():
        clock.now += 1
    assert clock.now - moved == 20
