"""Gate policy: priority classes, capacities and queue bounds, validated on construction.

Policies are immutable values so a reload can swap one in whole; the gate
derives each class's effective capacity from them with `class_capacity`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from sluicegate.config import lower_class_share


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    """One priority class: how many may wait in its queue and for how long."""

    name: str
    max_queue: int  # >= 0 waiters; 0 = never wait (shed at once when there is no room)
    max_wait_s: float  # > 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"priority class name must be a non-empty string, got {self.name!r}")
        if not _is_int(self.max_queue) or self.max_queue < 0:
            raise ValueError(
                f"class {self.name}: max_queue must be an integer >= 0, got {self.max_queue!r}"
            )
        wait = self.max_wait_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
            raise ValueError(f"class {self.name}: max_wait_s must be a finite number, got {wait!r}")
        if wait <= 0:
            raise ValueError(f"class {self.name}: max_wait_s must be > 0, got {wait!r}")


@dataclass(frozen=True, slots=True)
class GatePolicy:
    """Capacities of one gate and its classes, highest priority first.

    `headroom` is the share of both capacities that only the top class may use,
    so a flood of lower-priority work can never take the last slots.
    """

    classes: tuple[ClassPolicy, ...]
    max_requests: int | None = None  # in-flight requests; None = unbounded
    max_tokens: int | None = None  # in-flight estimated tokens; None = unbounded
    headroom: float = 0.0  # in [0, 1)
    max_queued: int | None = None  # waiters of all classes together; None = only per class

    def __post_init__(self) -> None:
        if not isinstance(self.classes, tuple) or not self.classes:
            raise ValueError("a gate policy needs a non-empty tuple of priority classes")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"priority class names must be unique, got {names}")
        for field, value in (("max_requests", self.max_requests), ("max_tokens", self.max_tokens)):
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"{field} must be an integer >= 1 or None, got {value!r}")
        if self.max_queued is not None and (not _is_int(self.max_queued) or self.max_queued < 0):
            raise ValueError(f"max_queued must be an integer >= 0 or None, got {self.max_queued!r}")
        h = self.headroom
        if isinstance(h, bool) or not isinstance(h, int | float) or not 0 <= h < 1:
            raise ValueError(f"headroom must be a number in [0, 1), got {h!r}")

    def index(self, name: str) -> int:
        """Rank of a class (0 = highest priority); ValueError for an unknown class."""
        for rank, cls in enumerate(self.classes):
            if cls.name == name:
                return rank
        known = ", ".join(c.name for c in self.classes)
        raise ValueError(f"unknown priority class {name!r} (known: {known})")


class Capacity(NamedTuple):
    """What one class may hold in flight (all classes together); None = unbounded."""

    requests: int | None
    tokens: int | None


def _share(capacity: int | None, headroom: float) -> int | None:
    if capacity is None:
        return None
    return lower_class_share(capacity, headroom)


def class_capacity(policy: GatePolicy, rank: int) -> Capacity:
    """The top class gets the full capacities; every lower class gets capacity * (1 - headroom),
    rounded down but at least 1 (a gate of 4 with headroom 0.25 keeps 1 slot for the top class).
    """
    if rank == 0:
        return Capacity(policy.max_requests, policy.max_tokens)
    return Capacity(
        _share(policy.max_requests, policy.headroom), _share(policy.max_tokens, policy.headroom)
    )
