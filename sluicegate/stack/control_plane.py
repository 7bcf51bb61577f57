"""The control plane's one job: turn a config file into pushed state.

It loads and validates the YAML, translates it (pure) into Envoy resources,
hands the snapshot to the ADS cache (which pushes only what changed) and the
routing table to the ext_proc filter. An invalid file never replaces the last
good config: the error is kept for `/status` and logged with file:line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sluicegate.config import Config, ConfigError, load_config, resolve_api_keys
from sluicegate.filters import RoutingTable
from sluicegate.xds.server import Snapshot, SnapshotCache
from sluicegate.xds.translate import build_ir, routing_table_entries, translate

log = logging.getLogger("sluicegate.control_plane")


@dataclass
class ReloadOutcome:
    """What the last attempt to load the file did."""

    ok: bool
    at: float
    problems: list[str] = field(default_factory=list)
    changed_types: list[str] = field(default_factory=list)


class ControlPlane:
    """Owns the current config and publishes it to Envoy and the filter."""

    def __init__(
        self,
        path: Path,
        cache: SnapshotCache,
        on_routing_table: Callable[[RoutingTable], None] = lambda table: None,
    ) -> None:
        self.path = path
        self.cache = cache
        self.on_routing_table = on_routing_table
        self.config: Config | None = None
        self.snapshot: Snapshot | None = None
        self.routing_table = RoutingTable.empty()
        self.last_outcome: ReloadOutcome | None = None
        self.reloads_ok = 0
        self.reloads_failed = 0

    def load(self) -> ReloadOutcome:
        """Load the file; on success publish it, on failure keep serving the last good one."""
        try:
            config = load_config(self.path)
            keys = resolve_api_keys(config, self.path)
        except ConfigError as err:
            self.reloads_failed += 1
            problems = [str(p) for p in err.problems]
            for line in problems:
                log.error("config rejected, last good config keeps serving: %s", line)
            self.last_outcome = ReloadOutcome(ok=False, at=time.time(), problems=problems)
            return self.last_outcome
        ir = build_ir(config, keys)
        snapshot = Snapshot.from_resources(translate(ir))
        changed = _changed_types(self.snapshot, snapshot)
        self.config = config
        self.snapshot = snapshot
        # Filter first: a model that Envoy is about to route must already be known to it.
        self.routing_table = RoutingTable.from_entries(routing_table_entries(ir))
        self.on_routing_table(self.routing_table)
        self.cache.set_snapshot(snapshot)
        self.reloads_ok += 1
        self.last_outcome = ReloadOutcome(ok=True, at=time.time(), changed_types=changed)
        if changed:
            log.info("config %s published; changed: %s", self.path, ", ".join(changed))
        return self.last_outcome


def _changed_types(old: Snapshot | None, new: Snapshot) -> list[str]:
    if old is None:
        return sorted(new.type_urls())
    return sorted(t for t in new.type_urls() | old.type_urls() if old.version(t) != new.version(t))
