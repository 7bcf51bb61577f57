"""Where each fast-lane tenant's token buckets live: its slot among the listener's
limiter filters (docs/fast-lane.md, "Limits").

Envoy 1.40 rebuilds every HTTP filter of a listener it updates, refilling the buckets of
all of them, and rebuilds one filter whose own configuration (ECDS) changes. So the
listener names a fixed number of limiter filters (slots), each holding at most one
tenant's buckets: adding, changing or removing a tenant changes only its own slot. The
control plane hands the last published slots back in (as it hands drains and learned
weights), so tenants keep theirs across reloads; only when the slots are all taken does
their number double, which changes the listener once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

MIN_SLOTS: Final = 8


@dataclass(frozen=True, slots=True)
class LimitSlots:
    """`count` limiter filters; `of` gives each limited tenant's slot (0 ≤ slot < count)."""

    count: int = 0
    of: Mapping[str, int] = field(default_factory=dict)

    def tenant_in(self, slot: int) -> str | None:
        return next((tenant for tenant, held in self.of.items() if held == slot), None)


def assign_slots(tenants: Iterable[str], previous: LimitSlots | None = None) -> LimitSlots:
    """Slots for `tenants` (the limited ones): each keeps its slot in `previous`, a new
    one takes the lowest free slot, in name order. The count is 0 without tenants, else
    at least MIN_SLOTS, doubled while too small, and never lowered from `previous` (a
    smaller count would change the listener)."""
    wanted = sorted(set(tenants))
    if not wanted:
        return LimitSlots(previous.count if previous else 0, {})
    count = max(MIN_SLOTS, previous.count if previous else 0)
    while count < len(wanted):
        count *= 2
    kept = {t: s for t, s in (previous.of.items() if previous else ()) if t in wanted}
    free = iter(sorted(set(range(count)) - set(kept.values())))
    slots = dict(kept)
    for tenant in wanted:
        if tenant not in slots:
            slots[tenant] = next(free)
    return LimitSlots(count, dict(sorted(slots.items())))
