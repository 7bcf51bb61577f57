"""A bounded set of recently seen ids, oldest forgotten first."""

from __future__ import annotations

from collections import OrderedDict


class RecentIds:
    """Remembers the last `capacity` ids added. A forgotten id is merely new again: for
    the fast lane's charge ids (charge.charge_fast_lane) the store's duplicate check
    then refuses it, so the bound costs a store call, never a second charge."""

    __slots__ = ("_capacity", "_ids")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, item: object) -> bool:
        return item in self._ids

    def add(self, item: str) -> bool:
        """Remember `item` as the newest; whether it was new."""
        ids = self._ids
        if item in ids:
            ids.move_to_end(item)
            return False
        ids[item] = None
        if len(ids) > self._capacity:
            ids.popitem(last=False)
        return True

    def discard(self, item: str) -> None:
        self._ids.pop(item, None)
