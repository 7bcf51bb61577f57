"""sluicegate.filters.limiter: token-aware rate limits (reserve, then reconcile).

Each limit is an exact sliding-window log: any interval of one window admits at
most the limit (a token bucket would admit up to twice that over a window).
Stores: MemoryStore (one process), RedisStore (shared by replicas), and
FailoverStore (RedisStore plus fail-open / fail-closed / local fallback).
"""

from .decision import RETRY_WALK_CAP
from .failover import FailoverStore
from .memory import MemoryStore
from .model import (
    KINDS,
    Decision,
    DuplicateReservation,
    Kind,
    Limit,
    LimiterStore,
    LimitState,
    OnFailure,
    StoreBusy,
    StoreMode,
    StoreObserver,
    StoreUnavailable,
    Usage,
)
from .redis_store import RedisStore

__all__ = [
    "KINDS",
    "RETRY_WALK_CAP",
    "Decision",
    "DuplicateReservation",
    "FailoverStore",
    "Kind",
    "Limit",
    "LimitState",
    "LimiterStore",
    "MemoryStore",
    "OnFailure",
    "RedisStore",
    "StoreBusy",
    "StoreMode",
    "StoreObserver",
    "StoreUnavailable",
    "Usage",
]
