"""Limiter slots (model/limit_slots.py): a tenant keeps its slot across reloads, so a
reload changes only the slots of the tenants it changes, and the listener (the number of
slots) only when they are all taken."""

from __future__ import annotations

from sluicegate.model import MIN_SLOTS, LimitSlots, assign_slots


def test_no_limited_tenant_needs_no_slot() -> None:
    assert assign_slots([]) == LimitSlots(0, {})


def test_new_tenants_take_the_lowest_free_slots_in_name_order() -> None:
    slots = assign_slots(["b", "a"])
    assert slots == LimitSlots(MIN_SLOTS, {"a": 0, "b": 1})


def test_tenants_keep_their_slots_when_others_come_and_go() -> None:
    first = assign_slots(["a", "b", "c"])
    second = assign_slots(["c", "a", "d"], first)  # b leaves, d comes
    assert second.of == {"a": 0, "c": 2, "d": 1}
    assert second.count == first.count
    third = assign_slots([], second)
    assert third == LimitSlots(first.count, {})  # the listener keeps its slots


def test_the_count_doubles_only_when_the_slots_are_all_taken() -> None:
    names = [f"t{i:02d}" for i in range(MIN_SLOTS)]
    full = assign_slots(names)
    assert full.count == MIN_SLOTS
    grown = assign_slots([*names, "new"], full)
    assert grown.count == 2 * MIN_SLOTS
    assert {name: grown.of[name] for name in names} == full.of
    assert grown.of["new"] == MIN_SLOTS
    assert grown.tenant_in(MIN_SLOTS) == "new"
    assert grown.tenant_in(MIN_SLOTS + 1) is None
