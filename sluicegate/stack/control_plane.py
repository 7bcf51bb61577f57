"""The control plane's one job: turn a config file into pushed state.

It loads and validates the YAML, reads the provider keys (env or file) again,
resolves it once (sluicegate.model), translates that (pure) into Envoy resources,
hands the snapshot to the ADS cache (which pushes only what changed) and the same
model to the ext_proc filter (routing table and admission policy).
An invalid file never replaces the last good config: the error is kept for
`/status` and logged with file:line.

Keys go to Envoy only as SDS secrets (`sluicegate-key-<provider>`); a rotated
key changes only its secret, which Envoy swaps in place (no cluster re-warms,
streams in flight continue). `watched_paths` lists the config file and the key
files of the last good config, so editing either reloads.

Live drains (`sluicegate drain`) are kept in `drained_file` when one is given (`up`
gives its work directory's `drained.json`), so a restarted control plane publishes
the same snapshot, with the same versions, and a reconnecting Envoy is sent nothing.

`routing: latency` routes get the weights the latency router learned (sluicegate.latency)
as data: `build_model(...)` gives the configured weights, `Gateway.with_weights` the
learned ones, and translation stays pure. A reload keeps what was learned for the routes
and providers still there; a weight change alone (`tick_weights`, once a second) replaces
only the EDS resources of the snapshot, so no other type's version moves and no listener,
route or cluster is sent again (docs/latency-routing.md).

`auto` tenants get the lanes the lane steering chose (sluicegate.lanes) the same way,
`Gateway.with_lanes`; a move (`tick_lanes`, every LaneSettings.tick_s) changes only the key
check's configuration, an ECDS resource, so no bucket is refilled and no listener updated
(docs/fast-lane.md, "The auto lane"). Both are fed by the records Envoy sends the control
plane (`on_records`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluicegate import wire
from sluicegate.config import (
    Config,
    ConfigError,
    load_config,
    resolve_api_keys,
    resolve_client_keys,
)
from sluicegate.lanes import LaneMove, LaneSteering
from sluicegate.latency import LatencyRouter, WeightChange
from sluicegate.model import Gateway, build_model
from sluicegate.native import NativeModule, resolve_module
from sluicegate.records import decode, log_name
from sluicegate.stack.native_nodes import NativeNodes
from sluicegate.stack.rejection import log_rejection
from sluicegate.xds.server import ENDPOINT, Snapshot, SnapshotCache
from sluicegate.xds.translate import RouteMemo, translate

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
        on_model: Callable[[Gateway], None] = lambda gateway: None,
        drained_file: Path | None = None,
        latency: LatencyRouter | None = None,
        lanes: LaneSteering | None = None,
    ) -> None:
        self.path = path
        self.cache = cache
        self.on_model = on_model
        self.config: Config | None = None
        # The resolved model of the last good config (drains applied), as pushed: with the
        # learned weights of its latency routes; `configured` with the file's.
        self.model: Gateway | None = None
        self.configured: Gateway | None = None
        # Learned weights of `routing: latency` routes, fed by Envoy's latency record log.
        self.latency = latency or LatencyRouter()
        # The lanes of `auto` tenants, fed by Envoy's lane record log.
        self.lanes = lanes or LaneSteering()
        self.snapshot: Snapshot | None = None
        self.last_outcome: ReloadOutcome | None = None
        self.reloads_ok = 0
        self.reloads_failed = 0
        self.keys: dict[str, str | None] = {}
        # Client key name -> key, for keys Envoy checks itself (the fast lane).
        self.client_keys: dict[str, str] = {}
        # Providers drained live by `sluicegate drain` (the file's `drain: true` adds to these).
        self.drained_file = drained_file
        self.drained: set[str] = _read_drained(drained_file)
        # Per-route resources of the last push, reused for routes a reload left alone.
        self._memo = RouteMemo()
        # The native filters library of the last good config (sluicegate.native).
        self.native: NativeModule | None = None
        # Envoys that name their own native filters library (native_nodes.py).
        self.native_nodes = NativeNodes(cache)

    def watched_paths(self) -> list[Path]:
        """The config file, then the key files its last good version names, providers' and
        clients' (resolved as `resolve_api_keys` does: relative to the config file's
        directory)."""
        paths = [self.path]
        if self.config is not None:
            sources = [provider.api_key for provider in self.config.providers]
            sources += [key.secret for tenant in self.config.tenants for key in tenant.keys]
            for source in sources:
                if source is not None and source.file is not None:
                    key_file = Path(source.file).expanduser()
                    paths.append(
                        key_file if key_file.is_absolute() else self.path.parent / key_file
                    )
        return paths

    def load(self) -> ReloadOutcome:
        """Load the file; on success publish it, on failure keep serving the last good one."""
        try:
            config = load_config(self.path)
            keys = resolve_api_keys(config, self.path)
            client_keys = resolve_client_keys(config, self.path)
        except ConfigError as err:
            return self._reject([str(p) for p in err.errors], err.warnings)
        self.keys = keys
        self.client_keys = client_keys
        return self.publish(config)

    def set_drained(self, provider: str, drained: bool) -> ReloadOutcome:
        """`sluicegate drain`: take a provider out of (or back into) rotation, live.

        Kept across reloads until undone; the file's `drain: true` adds to it.
        """
        if self.config is None or provider not in {p.name for p in self.config.providers}:
            raise KeyError(provider)
        before = set(self.drained)
        if drained:
            self.drained.add(provider)
        else:
            self.drained.discard(provider)
        outcome = self.publish(self.config)
        if not outcome.ok:
            self.drained = before  # not published, so not in force
            return outcome
        if self.drained_file is not None:
            _write_drained(self.drained_file, self.drained)
        log.info("provider %s %s", provider, "drained" if drained else "back in rotation")
        return outcome

    def publish(self, config: Config) -> ReloadOutcome:
        """Translate config (with drains applied) and hand it to Envoy and the filter."""
        # Tenants keep their limiter slots (model/limit_slots.py).
        slots = None if self.configured is None else self.configured.limit_slots
        native = self._native_module(config.native_filters.module)
        configured = build_model(
            config, self.keys, self.drained, self.client_keys, slots, native.path
        )
        for warning in configured.warnings:
            log.warning("%s", warning)
        self.latency.load(configured)  # keeps what was learned of routes still there
        lanes_before = self.lanes.saved()
        self.lanes.load(configured)  # keeps auto tenants' usage and lanes
        model = self._steered(configured)
        snapshot = Snapshot.from_resources(translate(model, self._memo))
        # docs/xds-rules.md rule 14: a snapshot naming a resource it lacks is never
        # published; the last good config (Envoy's and the filter's) keeps serving.
        missing = self.cache.missing_references(snapshot)
        if missing:
            if self.configured is not None:
                self.latency.load(self.configured)  # back to the routes still served
            self.lanes.restore(lanes_before)  # its tenants keep their lanes and counts
            shown = [f"inconsistent snapshot, not published: {m}" for m in missing[:5]]
            more = [f"(and {len(missing) - 5} more)"] if len(missing) > 5 else []
            return self._reject(shown + more)
        changed = _changed_types(self.snapshot, snapshot)
        if native != self.native:
            if native.error:
                log.warning("native filters: %s\n%s", native.why, native.error)
            else:
                log.info("native filters: %s (%s)", native.path or "none", native.why)
        self.native = native
        self.config = config
        self.configured = configured
        self.model = model
        self.snapshot = snapshot
        # Filter first: a model that Envoy is about to route must already be known to it.
        self.on_model(model)
        self.cache.set_snapshot(snapshot)
        self.native_nodes.publish(snapshot, model, native.setting)
        self.reloads_ok += 1
        self.last_outcome = ReloadOutcome(ok=True, at=time.time(), changed_types=changed)
        if changed:
            log.info("config %s published; changed: %s", self.path, ", ".join(changed))
        return self.last_outcome

    def _native_module(self, setting: str) -> NativeModule:
        """The library of `setting` (sluicegate.native.resolve_module), resolved again only
        when the setting changed: `auto` runs gcc (about a second, on the event loop) on
        its first load, and a failed build is not retried on every reload or drain."""
        if self.native is not None and setting == self.native.setting:
            return self.native
        return resolve_module(setting)

    def tick_weights(self) -> list[WeightChange]:
        """Move the learned weights one step (LatencyRouter.tick) and push the routes whose
        weights changed: only their ClusterLoadAssignments are new, every other resource of
        the snapshot is the one Envoy has. Returns what was pushed (each logged)."""
        if self.configured is None or self.snapshot is None:
            return []
        changes = self.latency.tick()
        if not changes:
            return []
        model = self._steered(self.configured)
        endpoints = Snapshot.from_resources({ENDPOINT: translate(model, self._memo)[ENDPOINT]})
        current = self.snapshot
        snapshot = Snapshot(
            {
                **{type_url: current.resources(type_url) for type_url in current.type_urls()},
                ENDPOINT: endpoints.resources(ENDPOINT),
            }
        )
        self._push_steered(model, snapshot, changes)
        return changes

    def tick_lanes(self) -> list[LaneMove]:
        """Move `auto` tenants whose usage crossed a threshold (LaneSteering.tick) and push
        the key check that names their clients' new lane. The whole snapshot is translated
        again (a move is rare); the cache sends only what changed: that one ECDS resource
        (tests/stack/test_control_plane_lanes.py). Returns the moves (each logged)."""
        if self.configured is None or self.snapshot is None:
            return []
        moves = self.lanes.tick()
        if not moves:
            return []
        model = self._steered(self.configured)
        self._push_steered(model, Snapshot.from_resources(translate(model, self._memo)), moves)
        return moves

    def on_records(self, batch: Sequence[Any]) -> int:
        """Records the control plane's LogsService took (records.RecordBatches): the
        ext_proc servers' usage notes to the lane steering (sluicegate.lanes), Envoy's
        latency log's records to the latency router."""
        notes = [r for r in batch if log_name(r) == wire.LANE_USAGE_LOG_NAME]
        counted = self.lanes.on_records(notes) if notes else 0
        if len(notes) < len(batch):
            # The latency log's (one with no body: from an Envoy before the body).
            for log_record in batch:
                if log_name(log_record) != wire.LANE_USAGE_LOG_NAME:
                    counted += self.latency.observe(decode(log_record, {}))
        return counted

    def _push_steered(
        self, model: Gateway, snapshot: Snapshot, steps: Sequence[WeightChange | LaneMove]
    ) -> None:
        """Publish a steered model (its weights or lanes moved) and log each step."""
        self.cache.set_snapshot(snapshot)
        if self.native is not None:
            self.native_nodes.publish(snapshot, model, self.native.setting)
        self.model = model
        self.snapshot = snapshot
        for step in steps:
            log.info("%s", step.describe())

    def _steered(self, configured: Gateway) -> Gateway:
        """`configured` with the learned weights and the auto tenants' current lanes."""
        return configured.with_weights(self.latency.weights()).with_lanes(self.lanes.lanes())

    def _reject(self, problems: list[str], warnings: Iterable[object] = ()) -> ReloadOutcome:
        """Keep serving the last good config, and say why the new one was not taken."""
        self.reloads_failed += 1
        log_rejection(log, problems, warnings)
        self.last_outcome = ReloadOutcome(ok=False, at=time.time(), problems=problems)
        return self.last_outcome


def _changed_types(old: Snapshot | None, new: Snapshot) -> list[str]:
    if old is None:
        return sorted(new.type_urls())
    return sorted(t for t in new.type_urls() | old.type_urls() if old.version(t) != new.version(t))


def _read_drained(path: Path | None) -> set[str]:
    """The providers a previous run of the control plane drained live (none if unknown)."""
    if path is None:
        return set()
    try:
        names = json.loads(path.read_text())
    except FileNotFoundError:
        return set()
    except (OSError, ValueError) as err:
        log.error("ignoring %s: %s", path, err)
        return set()
    return {name for name in names if isinstance(name, str)} if isinstance(names, list) else set()


def _write_drained(path: Path, drained: set[str]) -> None:
    """Replace the file whole (write, then rename), so a crash never leaves half of it."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(sorted(drained)))
    os.replace(partial, path)
