"""Reuse the per-route resources of the last translation for routes that did not change.

A reload usually changes a route or two, yet a full translation of 1,000 routes costs
about half a second of Python. Each route's cluster, endpoints and model routes depend
only on that route's model (its backends carry the providers) and the gateway limits, so
they are looked up by a key made of exactly those (and what a caller adds to `what`: a
cluster also depends on the native library it names); anything else that changes makes a
new key. Results are protobuf messages shared between snapshots: nothing mutates a
translated message after it is built (the server serializes them, copies are made
elsewhere). Only the keys used by the latest translation are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from sluicegate.model import Limits, Route

T = TypeVar("T")


def route_key(
    route: Route, limits: Limits, provider_keys: dict[int, Hashable] | None = None
) -> Hashable:
    """Every input of a route's translation. Settings are a pydantic model holding lists,
    so they enter as their JSON (about 7 µs). Routes share provider objects, so each
    provider's hash is taken once per translation (`provider_keys`, by identity)."""
    provider_keys = {} if provider_keys is None else provider_keys
    backends = []
    for backend in route.backends:
        provider = backend.provider
        known = provider_keys.get(id(provider))
        if known is None:
            known = provider_keys[id(provider)] = (provider, hash(provider))
        backends.append((known, backend.weight, backend.priority))
    return (
        route.name,
        route.models,
        route.path_prefix,
        tuple(backends),
        route.fault,
        route.envoy_gate,
        route.settings.model_dump_json(),
        limits,
    )


class RouteMemo:
    """Per-route results keyed by (what, route_key); one generation is kept."""

    __slots__ = ("_current", "_keys", "_previous", "_providers", "hits", "misses")

    def __init__(self) -> None:
        self._previous: dict[Hashable, object] = {}
        self._current: dict[Hashable, object] = {}
        self._keys: dict[int, tuple[Route, Hashable]] = {}
        self._providers: dict[int, Hashable] = {}
        self.hits = 0
        self.misses = 0

    def get(self, what: Hashable, route: Route, limits: Limits, build: Callable[[], T]) -> T:
        """The cached result of `build` for this route, or a fresh one."""
        known = self._keys.get(id(route))
        if known is None or known[0] is not route:
            known = (route, route_key(route, limits, self._providers))
            self._keys[id(route)] = known
        return self.reuse((what, known[1]), build)

    def reuse(self, key: Hashable, build: Callable[[], T]) -> T:
        """The result kept under `key` (this or the last translation), or a fresh one."""
        if key in self._current:
            self.hits += 1
            return self._current[key]  # type: ignore[return-value]
        if key in self._previous:
            self.hits += 1
            value = self._previous[key]
        else:
            self.misses += 1
            value = build()
        self._current[key] = value
        return value  # type: ignore[return-value]

    def finish(self) -> None:
        """End of a translation: keep what it used, forget the rest."""
        self._previous, self._current = self._current, {}
        self._keys = {}
        self._providers = {}
