"""State shared by a provider's handlers: current settings, counters, random sources."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from sluicegate.provider.settings import MockProviderSettings
from sluicegate.provider.stats import ProviderStats


class ProviderState:
    """Everything the handlers share: current settings, counters and random sources."""

    def __init__(self, settings: MockProviderSettings) -> None:
        self.settings = settings
        self.stats = ProviderStats(name=settings.name)
        self.server: web.Server | None = None  # set once serving, for connections_open
        # Set by close(): hung requests end at once instead of holding up the shutdown.
        self.closing = asyncio.Event()
        self._reseed(settings.seed)

    def _reseed(self, seed: int | None) -> None:
        # Separate streams: how many tokens a request draws jitter for must not shift
        # which later request gets a fault.
        self.fault_rng = random.Random(None if seed is None else f"{seed}:faults")
        self.jitter_rng = random.Random(None if seed is None else f"{seed}:jitter")

    def configure(self, changes: Mapping[str, Any]) -> MockProviderSettings:
        """Apply runtime changes (validated as a whole); ValueError leaves settings as they were."""
        self.settings = self.settings.with_changes(changes)
        if "seed" in changes:
            self._reseed(self.settings.seed)
        return self.settings

    def stats_snapshot(self) -> dict[str, Any]:
        open_connections = len(self.server.connections) if self.server is not None else 0
        return self.stats.snapshot(connections_open=open_connections)


STATE_KEY = web.AppKey("sluicegate_mock_state", ProviderState)
