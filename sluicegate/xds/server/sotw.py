"""State-of-the-world ADS (`StreamAggregatedResources`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


class SotwStream(AdsStream):
    """One SotW stream. Listener/Cluster responses carry full state, other
    types only the resources that are new or changed for the client (rule 8)."""

    kind = "sotw"

    async def _on_request(self, request: Any) -> None:
        type_url: str = request.type_url
        state = self.types.get(type_url)
        first = state is None
        if state is None:
            state = self.types[type_url] = TypeState()
        nonce: str = request.response_nonce
        stale = state.latest_nonce is not None and nonce != state.latest_nonce
        pending = state.pending.pop(nonce, None)
        if pending is not None:
            if not stale:
                # The latest answer implies the client went through all earlier ones.
                state.pending.clear()
            if request.HasField("error_detail"):
                if not stale:
                    # Rule 4: the client keeps what it had; so do we.
                    state.known = pending.prev
                self.record_nack(type_url, state, pending, request)
            else:
                self.record_ack(type_url, pending)
        if stale:
            # Rule 6: a request answering an older response was overtaken by a
            # newer one; the client will answer that one with its full list.
            # (Its ACK or NACK above still counts for status.)
            log.debug("node %s: stale nonce %r on %s ignored", self.node_id, nonce, type_url)
            return
        change = state.sub.set_sotw(request.resource_names, type_url in FULL_STATE_TYPES)
        snapshot = self.snapshot()
        if change.removed or change.wildcard_removed:
            state.known = {n: e for n, e in state.known.items() if state.sub.wants(n)}
            if snapshot is not None and self.node is not None and state.responded:
                # Rule 9: the client dropped names and now holds a narrower view; nothing
                # is sent, so record the version that view hashes to (else status would
                # show EDS behind forever after clusters are removed).
                narrowed = self.version_of(state.known, snapshot, type_url)
                self._cache.ads_status.acked(self.node, type_url, narrowed)
        if snapshot is None:
            return
        if first and request.version_info and self._adopt(type_url, state, snapshot, request):
            return
        await self._respond(type_url, state, snapshot, change, first)

    def _adopt(self, type_url: str, state: TypeState, snapshot: Snapshot, request: Any) -> bool:
        """Rule 3: a reconnecting client says which version it has. Versions hash
        the names and contents of the client's view, so if it matches what we
        would send, the client has exactly that and nothing needs resending."""
        view = wanted(snapshot.resources(type_url), state.sub)
        if self.version_of(view, snapshot, type_url) != request.version_info:
            return False
        state.known = view
        state.responded = True
        if self.node is not None:
            self._cache.ads_status.acked(self.node, type_url, request.version_info)
        return True

    async def _respond(self, type_url: str, state: TypeState, snapshot: Snapshot,
                       change: Change, first: bool) -> None:  # fmt: skip
        """Answer a request: only subscription changes need an answer (rule 7);
        changes of config are pushed by the plan, in order."""
        resources = snapshot.resources(type_url)
        if type_url in FULL_STATE_TYPES:
            if state.responded and change.empty:
                return
            desired = wanted(resources, state.sub)
            if state.responded and desired == state.known:
                return
            await self._send(type_url, state, snapshot, desired, desired.values())
            return
        # Rule 10: newly requested names are sent even if the client had them.
        names: Iterable[str] = (
            wanted(resources, state.sub) if first or change.wildcard_added else change.requested
        )
        sent = {n: resources[n] for n in names if n in resources and state.sub.wants(n)}
        if not sent:
            return
        view = intern({**state.known, **sent}, resources)
        await self._send(type_url, state, snapshot, view, sent.values())

    async def _push(self, type_url: str, phase: Phase) -> Pending | None:
        state = self.types[type_url]
        snapshot = self.snapshot()
        if snapshot is None:
            return None
        resources = snapshot.resources(type_url)
        if type_url in FULL_STATE_TYPES:
            desired = wanted(resources, state.sub)
            if phase is Phase.UPSERT:
                # Rule 12: clusters that are gone stay in this response (the
                # routes still using them change later); removed last.
                stale = {
                    n: e for n, e in state.known.items()
                    if n not in desired and e.message is not None
                }  # fmt: skip
                if stale:
                    desired = {**desired, **stale}
            if state.responded and desired == state.known:
                return None
            return await self._send(type_url, state, snapshot, desired, desired.values())
        if phase is Phase.REMOVE:
            return None  # SotW cannot delete RDS/EDS; parents stop referring to them
        # Rule 7/8: only what changed, only what the client asked for.
        names = resources.keys() if state.sub.wildcard else state.sub.names
        changed = self.take_resend(state, resources)
        changed.update(
            (n, resources[n])
            for n in names
            if n in resources and state.known.get(n) != resources[n]
        )
        if not changed:
            return None
        view = intern({**state.known, **changed}, resources)
        return await self._send(type_url, state, snapshot, view, changed.values())

    async def _send(self, type_url: str, state: TypeState, snapshot: Snapshot,
                    view: Mapping[str, ResourceEntry], entries: Iterable[ResourceEntry],
                    ) -> Pending | None:  # fmt: skip
        version = self.version_of(view, snapshot, type_url)
        if state.quarantined(snapshot, type_url, version):
            log.debug(
                "node %s: %s version %s was NACKed; not resending", self.node_id, type_url, version
            )
            self._held = True
            return None
        nonce, seq = self.next_nonce()
        # Rule 11: keyed by name, so no name goes out twice.
        sent = {e.name: e for e in entries}
        response = discovery_pb2.DiscoveryResponse(
            version_info=version,
            resources=[e.any for e in sent.values()],
            type_url=type_url,
            nonce=nonce,
        )
        pending = Pending(nonce, seq, version, snapshot.version(type_url), state.known, sent)
        if len(state.pending) >= MAX_PENDING:
            state.pending.pop(next(iter(state.pending)))
        state.pending[nonce] = pending
        state.latest_nonce = nonce
        state.known = view
        state.responded = True
        await self._context.write(response)
        self.record_sent(type_url, version)
        if type_url == CLUSTER:
            self.note_cluster_changes(pending)
        return pending
