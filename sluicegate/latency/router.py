"""LatencyRouter: the control plane's learned provider weights of `routing: latency` routes.

    router = LatencyRouter()
    router.load(gateway)              # each config load (configured weights: the priors)
    router.on_records(batch)          # LogsService batches from Envoy (records.logs_handler)
    changes = router.tick()           # once a second: move shares, say which routes to push
    gateway.with_weights(router.weights())   # what the control plane translates and pushes

Per route it keeps each provider's smoothed figures (tracker.py) and, per priority level,
the current shares (moving each tick toward the weighing's target, weighing.py) and the
shares last pushed; a route is pushed when a share moved `push_threshold` from what Envoy
has, or came back to exactly the configured shares. Weights act within a priority level
only, so the fallback order is the file's. A reload keeps what was learned for every route
and provider that is still there. The clock is passed in, so tests run it by hand.
docs/latency-routing.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sluicegate.model import Gateway, Route
from sluicegate.records import RequestRecord, decode

from .tracker import ProviderTracker, Smoothed, observe
from .weighing import Shares, Weighing, distance, same, step, target_shares

# Envoy weights of a level whose shares are not the configured ones: shares in 1/10,000.
WEIGHT_SCALE: Final = 10_000
_NO_MODEL_MAPS: Final[Mapping[str, Mapping[str, str]]] = {}


@dataclass(slots=True)
class _Level:
    """One priority level of a route: its providers' configured weights and shares."""

    configured: dict[str, int]
    priors: dict[str, float]
    current: dict[str, float]
    pushed: dict[str, float]

    @classmethod
    def of(cls, configured: dict[str, int], before: _Level | None) -> _Level:
        total = sum(configured.values())
        priors = {name: weight / total for name, weight in configured.items()}
        if before is None or set(before.current) != set(configured):
            current = _carried(before.current if before else {}, priors)
            return cls(configured, priors, current, dict(current))
        if same(before.pushed, before.priors):
            # Nothing learned: an edit of the weights takes effect at once, as on a static
            # route, not damped from the old weights.
            return cls(configured, priors, dict(priors), dict(priors))
        return cls(configured, priors, before.current, before.pushed)

    def envoy_weights(self) -> dict[str, int]:
        """The configured weights while the pushed shares are the priors, so a route with
        nothing learned is pushed exactly as a static one; else shares in WEIGHT_SCALE."""
        if same(self.pushed, self.priors):
            return dict(self.configured)
        return {name: max(1, round(share * WEIGHT_SCALE)) for name, share in self.pushed.items()}


def _carried(old: Shares, priors: Shares) -> dict[str, float]:
    """Shares for a level whose providers changed: those still there keep what they had
    learned relative to each other, the new ones start at their prior."""
    kept = {name: old[name] for name in priors if name in old}
    if not kept:
        return dict(priors)
    room = sum(priors[name] for name in kept)
    kept_total = sum(kept.values())
    return {
        name: kept[name] * room / kept_total if name in kept else prior
        for name, prior in priors.items()
    }


@dataclass(slots=True)
class _RouteState:
    levels: list[_Level]
    trackers: dict[str, ProviderTracker]


@dataclass(frozen=True, slots=True)
class ProviderWeight:
    """One provider of one route, as /status and /metrics show it. `weight` is in the
    configured weights' unit (the level's configured total split by the pushed shares),
    so it equals `configured_weight` while nothing is learned."""

    weight: float
    configured_weight: int
    share: float  # of its priority level, as pushed
    ttft_s: float | None = None
    tpot_s: float | None = None
    error_rate: float | None = None
    samples: int = 0


@dataclass(frozen=True, slots=True)
class WeightChange:
    """One push of a route's learned weights."""

    route: str
    before: dict[str, float]  # provider -> share of its level
    after: dict[str, float]
    smoothed: dict[str, Smoothed] = field(default_factory=dict)

    def describe(self) -> str:
        """The one log line of this push."""
        parts = []
        for name in sorted(self.after):
            figures = self.smoothed.get(name)
            ttft = "-" if figures is None or figures.ttft_s is None else f"{figures.ttft_s:.3f}s"
            errors = (
                "-"
                if figures is None or figures.error_rate is None
                else f"{figures.error_rate:.0%}"
            )
            parts.append(
                f"{name} {self.before.get(name, 0.0):.1%}->{self.after[name]:.1%} "
                f"(ttft {ttft}, errors {errors})"
            )
        return f"route {self.route}: latency weights pushed: {', '.join(parts)}"


class LatencyRouter:
    """Learned weights of the `routing: latency` routes, from their request records."""

    def __init__(
        self, weighing: Weighing | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.weighing = weighing or Weighing()
        self._clock = clock
        self._routes: dict[str, _RouteState] = {}
        # Every route's configured weights and levels, static ones too (for /status).
        self._configured: dict[str, list[dict[str, int]]] = {}
        self.records_counted = 0

    # ----- config --------------------------------------------------------------------------

    def load(self, gateway: Gateway) -> None:
        """Adopt a config load: `gateway` with its configured weights (drains applied)."""
        old = self._routes
        self._routes = {}
        self._configured = {}
        for route in gateway.routes:
            levels = _configured_levels(route)
            self._configured[route.name] = levels
            if not route.learns_weights:
                continue
            before = old.get(route.name)
            self._routes[route.name] = _RouteState(
                levels=[
                    _Level.of(configured, _level_of(before, configured)) for configured in levels
                ],
                trackers={
                    name: before.trackers[name]
                    if before is not None and name in before.trackers
                    else ProviderTracker(self.weighing.half_life_s)
                    for configured in levels
                    for name in configured
                },
            )

    # ----- records -------------------------------------------------------------------------

    def on_records(self, batch: Sequence[Any]) -> int:
        """Some OpenTelemetry LogRecords of a LogsService batch (records.RecordBatches)."""
        counted = 0
        for log_record in batch:
            record = decode(log_record, _NO_MODEL_MAPS)
            counted += self.observe(record)
        return counted

    def observe(self, record: RequestRecord) -> bool:
        """Count one record, if it is of a latency route's provider and says something."""
        state = self._routes.get(record.route)
        if state is None:
            return False
        tracker = state.trackers.get(record.provider)
        observation = observe(record) if tracker is not None else None
        if tracker is None or observation is None:
            return False
        tracker.add(observation, self._clock())
        self.records_counted += 1
        return True

    # ----- weighing ------------------------------------------------------------------------

    def tick(self) -> list[WeightChange]:
        """Move every level's shares one step toward its target; the routes to push."""
        now = self._clock()
        changes = []
        for name, state in self._routes.items():
            smoothed = {p: tracker.smoothed(now) for p, tracker in state.trackers.items()}
            before: dict[str, float] = {}
            after: dict[str, float] = {}
            for level in state.levels:
                if len(level.priors) < 2:
                    continue
                target = target_shares(level.priors, smoothed, self.weighing)
                level.current = step(level.current, target, self.weighing)
                moved = distance(level.current, level.pushed)
                # Back at the priors: push the last small step too, so a recovered route
                # runs on exactly the configured weights again.
                home = moved > 0 and same(level.current, level.priors)
                if moved >= self.weighing.push_threshold or home:
                    before.update(level.pushed)
                    after.update(level.current)
                    level.pushed = dict(level.current)
            if after:
                changes.append(WeightChange(name, before, after, smoothed))
        return changes

    def weights(self) -> dict[str, dict[str, int]]:
        """Envoy's weights for each latency route's providers (Gateway.with_weights)."""
        return {
            name: {p: w for level in state.levels for p, w in level.envoy_weights().items()}
            for name, state in self._routes.items()
        }

    # ----- observability -------------------------------------------------------------------

    def report(self) -> dict[str, dict[str, ProviderWeight]]:
        """Every route's providers: weights (configured and pushed) and, on latency
        routes, the smoothed figures."""
        now = self._clock()
        result: dict[str, dict[str, ProviderWeight]] = {}
        for name, levels in self._configured.items():
            state = self._routes.get(name)
            providers: dict[str, ProviderWeight] = {}
            for index, configured in enumerate(levels):
                total = sum(configured.values())
                pushed = state.levels[index].pushed if state is not None else None
                for provider, weight in configured.items():
                    share = pushed[provider] if pushed is not None else weight / total
                    figures = state.trackers[provider].smoothed(now) if state else None
                    providers[provider] = ProviderWeight(
                        weight=round(share * total, 3),
                        configured_weight=weight,
                        share=round(share, 4),
                        ttft_s=None if figures is None else figures.ttft_s,
                        tpot_s=None if figures is None else figures.tpot_s,
                        error_rate=None if figures is None else figures.error_rate,
                        samples=0 if figures is None else figures.samples,
                    )
            result[name] = providers
        return result


def _configured_levels(route: Route) -> list[dict[str, int]]:
    """The route's providers' configured weights, one dict per priority level in order."""
    levels: list[dict[str, int]] = [{} for _ in range(route.priority_levels)]
    for backend in route.backends:
        levels[backend.priority][backend.provider.name] = backend.weight
    return levels


def _level_of(state: _RouteState | None, configured: Mapping[str, int]) -> _Level | None:
    """The level of the route's previous state that held most of these providers."""
    if state is None:
        return None
    best = max(state.levels, key=lambda level: len(set(level.configured) & set(configured)))
    return best if set(best.configured) & set(configured) else None
