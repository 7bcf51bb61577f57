"""sluicegate.filters.queueing: priority admission in front of a route.

A `PriorityGate` bounds requests and estimated tokens in flight; requests that
do not fit wait in bounded per-class queues (strict priority, FIFO within a
class, headroom for the top class) or are shed with a `Shed` carrying the
reason and a Retry-After estimate.
"""

from .estimate import HoldTimes, retry_after_s
from .gate import PriorityGate
from .policy import Capacity, ClassPolicy, GatePolicy, class_capacity
from .shed import SHED_REASONS, Shed, ShedReason
from .slot import Slot

__all__ = [
    "SHED_REASONS",
    "Capacity",
    "ClassPolicy",
    "GatePolicy",
    "HoldTimes",
    "PriorityGate",
    "Shed",
    "ShedReason",
    "Slot",
    "class_capacity",
    "retry_after_s",
]
