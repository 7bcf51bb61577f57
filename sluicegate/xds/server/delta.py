"""Incremental ADS (`DeltaAggregatedResources`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from sluicegate.xds.resource import CLUSTER, FULL_STATE_TYPES
from sluicegate.xds.server.snapshot import ResourceEntry, Snapshot
from sluicegate.xds.server.stream import (
    MAX_PENDING,
    AdsStream,
    Pending,
    Phase,
    TypeState,
    intern,
    log,
    wanted,
)
from sluicegate.xds.server.subscription import Change


class DeltaStream(AdsStream):
    """One delta stream: each response carries changed resources and the
    names of removed ones (rule 13)."""

    kind = "delta"

    async def _on_request(self, request: Any) -> None:
        type_url: str = request.type_url
        state = self.types.get(type_url)
        first = state is None
        initial: Mapping[str, str] = {}
        if state is None:
            state = self.types[type_url] = TypeState()
            initial = dict(request.initial_resource_versions)
            # Rule 13: a reconnecting client lists what it already has.
            state.known = {n: ResourceEntry.placeholder(type_url, n, v) for n, v in initial.items()}
        if request.response_nonce:
            pending = state.pending.pop(request.response_nonce, None)
            if pending is None:
                log.debug(
                    "node %s: unknown or stale nonce %r on %s",
                    self.node_id,
                    request.response_nonce,
                    type_url,
                )
            elif request.HasField("error_detail"):
                self._revert(state, pending)
                self.record_nack(type_url, state, pending, request)
            else:
                self.record_ack(type_url, pending)
        # Rule 6: subscription changes apply whatever the nonce.
        change = state.sub.apply_delta(
            request.resource_names_subscribe, request.resource_names_unsubscribe,
            first=first, legacy_wildcard=type_url in FULL_STATE_TYPES,
        )  # fmt: skip
        if first:
            state.known = {n: e for n, e in state.known.items() if state.sub.wants(n)}
        self._forget(state, change)
        snapshot = self.snapshot()
        if snapshot is None:
            return
        await self._respond(type_url, state, snapshot, change, first, initial)

    @staticmethod
    def _revert(state: TypeState, pending: Pending) -> None:
        """A NACKed response was not applied: restore what it would have changed."""
        known = dict(state.known)
        for name, entry in pending.sent.items():
            if known.get(name) is entry:
                before = pending.prev.get(name)
                if before is None:
                    known.pop(name)
                else:
                    known[name] = before
        for name in pending.removed:
            if name not in known and name in pending.prev:
                known[name] = pending.prev[name]
        state.known = known

    @staticmethod
    def _forget(state: TypeState, change: Change) -> None:
        """Names the client no longer wants are dropped from what it has."""
        state.told_absent -= change.removed
        if change.removed or change.wildcard_removed:
            state.known = {n: e for n, e in state.known.items() if state.sub.wants(n)}

    async def _respond(self, type_url: str, state: TypeState, snapshot: Snapshot, change: Change,
                       first: bool, initial: Mapping[str, str]) -> None:  # fmt: skip
        resources = snapshot.resources(type_url)
        upserts: dict[str, ResourceEntry] = {}
        removed: dict[str, None] = {}  # ordered set: rule 11, no name twice
        if first or change.wildcard_added:
            # Rule 13: send only what differs from the versions the client holds.
            for name, entry in wanted(resources, state.sub).items():
                if state.known.get(name) != entry:
                    upserts[name] = entry
            for name in state.known:
                if name not in resources:
                    removed[name] = None
        for name in change.requested:
            found = resources.get(name)
            if found is not None:
                # Rule 10: sent even if unchanged, unless the client just told
                # us (initial_resource_versions) it has this very version.
                if initial.get(name) != found.version:
                    upserts[name] = found
            elif name not in state.told_absent:
                # The spec's way to say "does not exist (yet)"; remembered and
                # sent by a later push when it appears.
                removed[name] = None
                state.told_absent.add(name)
        if state.sub.wildcard:
            # Unsubscribing a name also covered by "*": say whether it stays.
            for name in change.removed:
                found = resources.get(name)
                if found is not None:
                    upserts[name] = found
                else:
                    removed[name] = None
        # Rule 9: a new wildcard subscription is answered even when there is nothing
        # to send (the type is empty): Envoy initializes its listeners only after its
        # first CDS answer, and would otherwise wait out CDS's initial_fetch_timeout.
        fresh_wildcard = first and state.sub.wildcard and not initial
        if upserts or removed or fresh_wildcard:
            await self._send(type_url, state, snapshot, upserts, tuple(removed))

    async def _push(self, type_url: str, phase: Phase) -> Pending | None:
        state = self.types[type_url]
        snapshot = self.snapshot()
        if snapshot is None:
            return None
        resources = snapshot.resources(type_url)
        upserts: dict[str, ResourceEntry] = {}
        removed: tuple[str, ...] = ()
        if phase is not Phase.REMOVE:
            upserts = self.take_resend(state, resources)
            source = resources if state.sub.wildcard else state.sub.names
            for name in source:
                found = resources.get(name)
                if found is not None and state.known.get(name) != found:
                    upserts[name] = found
        if phase is not Phase.UPSERT:
            removed = tuple(n for n in state.known if n not in resources)
        if not upserts and not removed:
            return None
        return await self._send(type_url, state, snapshot, upserts, removed)

    async def _send(self, type_url: str, state: TypeState, snapshot: Snapshot,
                    upserts: Mapping[str, ResourceEntry], removed: tuple[str, ...],
                    ) -> Pending | None:  # fmt: skip
        resources = snapshot.resources(type_url)
        view = dict(state.known)
        for name in removed:
            view.pop(name, None)
        view.update(upserts)
        final = intern(view, resources)
        version = self.version_of(final, snapshot, type_url)
        if state.quarantined(snapshot, type_url, version) and upserts:
            log.debug(
                "node %s: %s version %s was NACKed; not resending", self.node_id, type_url, version
            )
            self._held = True
            return None
        nonce, seq = self.next_nonce()
        response = discovery_pb2.DeltaDiscoveryResponse(
            system_version_info=version,
            resources=[e.delta_resource for e in upserts.values()],
            type_url=type_url,
            removed_resources=removed,
            nonce=nonce,
        )
        pending = Pending(nonce, seq, version, snapshot.version(type_url), state.known, upserts,
                          removed)  # fmt: skip
        if len(state.pending) >= MAX_PENDING:
            state.pending.pop(next(iter(state.pending)))
        state.pending[nonce] = pending
        state.known = final
        state.told_absent -= upserts.keys()
        state.responded = True
        await self._context.write(response)
        self.record_sent(type_url, version)
        if type_url == CLUSTER:
            self.note_cluster_changes(pending)
        return pending
