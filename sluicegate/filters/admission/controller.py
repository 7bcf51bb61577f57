"""The long-lived admission state of one ext_proc server: policy, store, gates, metrics.

Swapped piecewise on reload: a new policy replaces the old reference at once; gates of
routes that stay keep their waiters and slots (their capacities change in place); the
limiter store is replaced only when its settings change, and the old one is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from typing import Any, Final

from ..limiter import FailoverStore, LimiterStore, MemoryStore, RedisStore
from ..queueing import PriorityGate
from .metrics import AdmissionMetrics, StoreMetrics
from .pending import PendingCharges
from .policy import AdmissionPolicy, StoreSettings
from .recent import RecentIds

log = logging.getLogger("sluicegate.admission")

# The last 100,000 fast-lane requests (each record of a running one refreshes its id):
# about 20 MB.
FAST_LANE_IDS_KEPT: Final = 100_000


def make_store(settings: StoreSettings, metrics: AdmissionMetrics) -> LimiterStore:
    """The store the settings name: in-process memory, or Redis behind a failover policy."""
    if settings.kind != "redis" or settings.url is None:
        return MemoryStore()
    observer = StoreMetrics(metrics)
    redis = RedisStore(
        settings.url,
        key_prefix=settings.key_prefix,
        timeout_s=settings.timeout_s,
        observer=observer,
    )
    return FailoverStore(
        redis,
        on_failure=settings.on_failure,
        replicas=settings.replicas,
        observer=observer,
    )


class AdmissionController:
    __slots__ = (
        "_background",
        "_gates",
        "_store",
        "_store_settings",
        "fast_lane_ids",
        "fast_lane_pending",
        "metrics",
        "policy",
    )

    def __init__(
        self, policy: AdmissionPolicy | None = None, metrics: AdmissionMetrics | None = None
    ) -> None:
        self.metrics = metrics if metrics is not None else AdmissionMetrics()
        self.policy = AdmissionPolicy()
        self._gates: dict[str, PriorityGate] = {}
        self._store: LimiterStore | None = None
        self._store_settings: StoreSettings | None = None
        self._background: set[asyncio.Task[object]] = set()
        self.metrics.watch_gates(lambda: self._gates)
        # Fast-lane charge ids this process charged or settled (charge.charge_fast_lane):
        # a running request's records repeat every 500 ms, and skip the store once known.
        self.fast_lane_ids = RecentIds(FAST_LANE_IDS_KEPT)
        # Short fast-lane requests' charges of the batch of records being read.
        self.fast_lane_pending = PendingCharges()
        if policy is not None:
            self.update(policy)

    @property
    def gates(self) -> Mapping[str, PriorityGate]:
        return self._gates

    def store(self) -> LimiterStore:
        """The store, made on first use (a Redis client needs the running event loop)."""
        if self._store is None:
            self._store_settings = self.policy.store
            self._store = make_store(self.policy.store, self.metrics)
        return self._store

    def update(self, policy: AdmissionPolicy) -> None:
        """Adopt a reloaded policy (see the module docstring)."""
        gates: dict[str, PriorityGate] = {}
        for name, gate_policy in policy.gates.items():
            gate = self._gates.get(name)
            if gate is None:
                kind, _, short = name.partition(":")
                gate = PriorityGate(short, gate_policy, kind=kind)
            else:
                gate.update_policy(gate_policy)
            gates[name] = gate
        # Removed gates: their holders release into a gate nobody consults any more.
        self._gates = gates
        if self._store is not None and policy.store != self._store_settings:
            old, self._store = self._store, None
            self.spawn(old.close())
            log.info("limiter store settings changed; a new store takes over")
        self.policy = policy

    def spawn(self, coroutine: Coroutine[Any, Any, object]) -> None:
        """Run a coroutine in the background, keeping a reference until it ends (a
        refund after a cancelled request, a reconcile): nothing waits on it."""
        task: asyncio.Task[object] = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._finished)

    async def settled(self) -> None:
        """Wait until every background task started so far has ended (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def _finished(self, task: asyncio.Task[object]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("admission background task failed", exc_info=task.exception())

    def status(self) -> dict[str, Any]:
        """For `/status` and `sluicegate status`: what admission enforces right now."""
        policy = self.policy
        store = self._store
        return {
            "enabled": policy.enabled,
            "tenants": sorted(policy.tenants),
            "priority_classes": list(policy.classes),
            "store": {
                "kind": policy.store.kind,
                "on_failure": policy.store.on_failure if policy.store.kind == "redis" else None,
                # FailoverStore knows whether Redis answers; before first use: not yet made.
                "state": getattr(store, "state", "up") if store is not None else "not started",
            },
            "gates": {name: gate.snapshot() for name, gate in sorted(self._gates.items())},
        }

    async def close(self) -> None:
        await self.settled()
        if self._store is not None:
            await self._store.close()
            self._store = None
