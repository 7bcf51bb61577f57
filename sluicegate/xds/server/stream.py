"""What SotW and delta ADS streams share: the event loop, nonces, the
make-before-break push plan, and per-type client state.

Each stream runs one task that handles, in order, the client's requests and
"snapshot changed" wake-ups; a second task only reads requests into the
queue. Nothing polls: an idle stream costs two parked tasks.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import itertools
import logging
import os
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from sluicegate.xds.resource import (
    CLUSTER,
    ENDPOINT,
    EXTENSION_CONFIG,
    LISTENER,
    PUSH_ORDER,
    ROUTE,
    SECRET,
    eds_name,
)
from sluicegate.xds.server.cache import SnapshotCache
from sluicegate.xds.server.snapshot import ResourceEntry, Snapshot, view_version
from sluicegate.xds.server.status import NackRecord, NodeStatus, StreamKind
from sluicegate.xds.server.subscription import Subscription

log = logging.getLogger("sluicegate.xds.server")

#: Outstanding (unanswered) responses remembered per type; older ones are dropped.
MAX_PENDING = 64
#: Rejected versions remembered per type while the config stays the same.
MAX_NACKED = 32
# Secrets a NACK's message may quote: Envoy's proto errors print the rejected message as
# text (which ignores the `sensitive` annotation), e.g. a client key's `key: "sk-…"` or a
# provider key's `inline_string: "…"`; JSON-like quotes too. Envoy cuts a NACK's message
# at 4 KB, maybe inside a value: its closing quote is then optional.
_SECRET_FIELDS = re.compile(
    r'(?P<name>\b(?:key|inline_string|inline_bytes|secret)"?\s*[:=]\s*)"(?:[^"\\]|\\.)*"?'
)


def without_secrets(message: str) -> str:
    """A NACK's message with every quoted value of a field that may hold a key replaced
    (it goes to the log, /status and `sluicegate status`)."""
    return _SECRET_FIELDS.sub(lambda m: f'{m.group("name")}"[redacted]"', message)

#: End of stream marker of grpc.aio (missing from grpc-stubs).
GRPC_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]

_stream_ids = itertools.count(int.from_bytes(os.urandom(3), "big"))


class Phase(enum.Enum):
    """Steps of a make-before-break push (rule 12)."""

    #: Add and change resources; keep stale ones (SotW CDS: old plus new).
    UPSERT = "upsert"
    #: Add, change and remove in one response (LDS).
    FULL = "full"
    #: Remove what the snapshot no longer has (SotW CDS: the final state).
    REMOVE = "remove"


Step = list[tuple[str, Phase]]


def push_plan(type_urls: Iterable[str]) -> list[Step]:
    """Rule 12: SDS, ECDS, then CDS with EDS, then LDS, then RDS; stale resources removed last.

    Each step waits for the client's answer to what it sent before the next
    one starts. CDS and EDS share a step: Envoy does not ACK a changed
    cluster until it has its endpoints again, so EDS must not wait for that
    ACK. Secrets go first since filter configs, clusters and listeners refer
    to them; filter configs (ECDS) next, before the listeners and clusters
    whose filters discover them, so a changed filter config is in place
    before a listener that needs it, and changing only a filter config
    pushes only that. Types other than the six known ones follow RDS.
    Removals come last, in one step.
    """
    present = set(type_urls)
    extras = sorted(present - set(PUSH_ORDER))
    steps: list[Step] = [
        [(SECRET, Phase.UPSERT)],
        [(EXTENSION_CONFIG, Phase.UPSERT)],
        [(CLUSTER, Phase.UPSERT), (ENDPOINT, Phase.UPSERT)],
        [(LISTENER, Phase.FULL)],
        [(ROUTE, Phase.UPSERT)],
        *([(t, Phase.UPSERT)] for t in extras),
        [(t, Phase.REMOVE) for t in (ROUTE, *extras, CLUSTER, ENDPOINT, EXTENSION_CONFIG, SECRET)],
    ]
    kept = ([(t, p) for t, p in step if t in present] for step in steps)
    return [step for step in kept if step]


@dataclass(eq=False)
class Pending:
    """A response sent and not yet ACKed or NACKed."""

    nonce: str
    seq: int
    version: str
    #: The type's version in the snapshot the response was built from.
    snapshot_type_version: str
    prev: Mapping[str, ResourceEntry]
    sent: Mapping[str, ResourceEntry]
    removed: tuple[str, ...] = ()


@dataclass(eq=False)
class TypeState:
    """One stream's view of one resource type."""

    sub: Subscription = field(default_factory=Subscription)
    #: What the client has, as far as we know. Replaced, never mutated, so it
    #: can be the snapshot's own mapping (no per-stream copy when in sync).
    known: Mapping[str, ResourceEntry] = field(default_factory=dict)
    responded: bool = False
    #: SotW: nonce of the latest response on this type (rule 6).
    latest_nonce: str | None = None
    pending: dict[str, Pending] = field(default_factory=dict)
    #: Rule 5: versions rejected while the snapshot's type version was this.
    nacked_versions: set[str] = field(default_factory=set)
    nacked_under: str | None = None
    #: Delta: names already reported as absent (rule 10).
    told_absent: set[str] = field(default_factory=set)
    #: EDS: names to send even if unchanged, because their cluster changed and
    #: Envoy keeps a changed cluster warming until it gets its endpoints again.
    resend: set[str] = field(default_factory=set)

    def quarantined(self, snapshot: Snapshot, type_url: str, version: str) -> bool:
        """Rule 5: never resend a rejected version until the config changes.

        Quarantine is per stream: a new stream may be a restarted Envoy that
        has nothing, and the NACK stays visible in NodeStatus anyway."""
        if self.nacked_under is not None and self.nacked_under != snapshot.version(type_url):
            self.nacked_versions.clear()
            self.nacked_under = None
        return version in self.nacked_versions

    def remember_nack(self, pending: Pending) -> None:
        if self.nacked_under != pending.snapshot_type_version:
            self.nacked_versions.clear()
            self.nacked_under = pending.snapshot_type_version
        if len(self.nacked_versions) >= MAX_NACKED:
            self.nacked_versions.pop()
        self.nacked_versions.add(pending.version)


@dataclass
class Gate:
    """The push plan waits for the client to answer these responses."""

    #: type URL → sequence number of the response whose answer is awaited.
    waiting: dict[str, int]
    deadline: float
    plan_id: int


class _Event(enum.Enum):
    SNAPSHOT = "snapshot"
    EOF = "eof"
    TIMEOUT = "timeout"


def wanted(resources: Mapping[str, ResourceEntry], sub: Subscription
           ) -> Mapping[str, ResourceEntry]:  # fmt: skip
    """The part of a type's resources a subscription covers (the mapping itself if all)."""
    if sub.wildcard:
        return resources
    return {n: resources[n] for n in sub.names if n in resources}


def intern(view: Mapping[str, ResourceEntry], resources: Mapping[str, ResourceEntry]
           ) -> Mapping[str, ResourceEntry]:  # fmt: skip
    """Share the snapshot's mapping when the client's view equals it."""
    if view is resources or (len(view) == len(resources) and view == resources):
        return resources
    return view


class AdsStream(abc.ABC):
    """One ADS stream; subclasses speak SotW or delta."""

    kind: StreamKind

    def __init__(self, cache: SnapshotCache, context: Any, *, ack_timeout: float) -> None:
        self._cache = cache
        self._context = context
        self._ack_timeout = ack_timeout
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._dirty = False
        self._id = f"{next(_stream_ids) & 0xFFFFFF:06x}"
        self._seq = 0
        self.node_id: str | None = None
        self.node: NodeStatus | None = None
        self.types: dict[str, TypeState] = {}
        self._plan: deque[Step] = deque()
        self._plan_id = 0
        self._gate: Gate | None = None
        #: Set when a step skipped a send because that version was NACKed.
        self._held = False

    # ----- wake-ups from the cache ---------------------------------------------------------

    def snapshot_changed(self) -> None:
        """Called by the cache; coalesces bursts of changes into one wake-up."""
        if not self._dirty:
            self._dirty = True
            self._queue.put_nowait(_Event.SNAPSHOT)

    # ----- main loop -----------------------------------------------------------------------

    async def run(self) -> None:
        reader = asyncio.create_task(self._read())
        try:
            while True:
                event = await self._next_event()
                if event is _Event.EOF:
                    return
                if event is _Event.SNAPSHOT:
                    self._dirty = False
                    self._start_plan()
                    self.note_serving(self.types)
                elif event is _Event.TIMEOUT:
                    gate = self._gate
                    self._gate = None
                    if gate is not None:
                        log.warning(
                            "node %s: no answer to %s within %.1fs; pushing on",
                            self.node_id,
                            ", ".join(_short(t) for t in gate.waiting),
                            self._ack_timeout,
                        )
                else:
                    await self._handle(event)
                await self._advance()
        finally:
            reader.cancel()
            if self.node_id is not None:
                log.info("node %r: %s stream %s closed", self.node_id, self.kind, self._id)
                self._cache.unwatch(self.node_id, self)
            if self.node is not None:
                self._cache.ads_status.disconnect(self.node)

    async def _read(self) -> None:
        try:
            while True:
                request = await self._context.read()
                if request is GRPC_EOF:
                    break
                self._queue.put_nowait(request)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the stream broke; the main loop ends
            log.debug("stream %s read ended: %r", self._id, err)
        self._queue.put_nowait(_Event.EOF)

    async def _next_event(self) -> Any:
        if self._gate is None:
            return await self._queue.get()
        remaining = self._gate.deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return _Event.TIMEOUT
        try:
            async with asyncio.timeout(remaining):
                return await self._queue.get()
        except TimeoutError:
            return _Event.TIMEOUT

    async def _handle(self, request: Any) -> None:
        if not request.type_url:
            # Rule 2: ADS multiplexes types on one stream, so a request without
            # type_url cannot be attributed; end the stream rather than guess.
            await self._context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "ADS requests must carry type_url"
            )
        if self.node_id is None:
            self._identify(request)
        await self._on_request(request)
        self.note_serving((request.type_url,))
        eds = self.types.get(ENDPOINT)
        if eds is not None and eds.resend:
            # A cluster changed in an answer to this request; its endpoints follow it.
            await self._push(ENDPOINT, Phase.UPSERT)

    def _identify(self, request: Any) -> None:
        """Rule 1: only the first request carries `node`; remember it for the stream."""
        node = request.node
        if not node.id:
            log.warning("ADS stream %s: first request carries no node id", self._id)
        self.node_id = node.id
        self.node = self._cache.ads_status.connect(node.id, node.cluster, self.kind)
        # Its class before anything reads its snapshot: its first answer is its class's.
        node_class = self._cache.identify(node)
        self._cache.watch(node.id, self)
        log.info(
            "node %r (cluster %r%s) connected: %s stream %s",
            node.id,
            node.cluster,
            "" if node_class is None else f", class {node_class!r}",
            self.kind,
            self._id,
        )

    def snapshot(self) -> Snapshot | None:
        return self._cache.get_snapshot(self.node_id)

    def next_nonce(self) -> tuple[str, int]:
        """Rule 3: nonces are unique on the stream (and carry its id, so a nonce
        from another stream never matches)."""
        self._seq += 1
        return f"{self._id}-{self._seq}", self._seq

    # ----- make-before-break push plan (rule 12) -------------------------------------------

    def _start_plan(self) -> None:
        self._plan_id += 1
        self._plan = deque(push_plan(self.types))

    async def _advance(self) -> None:
        """Run plan steps until one sends something; then wait for its answer."""
        while self._gate is None and self._plan:
            waiting: dict[str, int] = {}
            self._held = False
            for type_url, phase in self._plan.popleft():
                if type_url in self.types:
                    sent = await self._push(type_url, phase)
                    if sent is not None:
                        waiting[type_url] = sent.seq
            if self._held:
                # Rule 5 + 12: this step would resend a rejected version, so it
                # cannot be made; what builds on it waits for a config change.
                self.hold_plan("a rejected version is still current")
            if waiting:
                deadline = asyncio.get_running_loop().time() + self._ack_timeout
                self._gate = Gate(waiting, deadline, self._plan_id)

    def hold_plan(self, why: str) -> None:
        if self._plan:
            log.warning("node %s: rest of this push held (%s)", self.node_id, why)
            self._plan.clear()

    def answered(self, type_url: str, pending: Pending, accepted: bool) -> None:
        """An ACK or NACK arrived for `pending`; release the plan's gate."""
        gate = self._gate
        if gate is None or pending.seq < gate.waiting.get(type_url, pending.seq + 1):
            return
        del gate.waiting[type_url]
        if not accepted:
            self._gate = None
            if gate.plan_id == self._plan_id:
                # Make before break: later steps may depend on what was rejected
                # (routes to a cluster Envoy refused), so keep the last good config.
                self.hold_plan(f"{_short(type_url)} was rejected")
        elif not gate.waiting:
            self._gate = None

    # ----- ACK / NACK bookkeeping ----------------------------------------------------------

    def record_ack(self, type_url: str, pending: Pending) -> None:
        if self.node is not None:
            self._cache.ads_status.acked(self.node, type_url, pending.version)
        self.answered(type_url, pending, accepted=True)

    def record_nack(self, type_url: str, state: TypeState, pending: Pending, request: Any) -> None:
        """Rule 4/5: a request with error_detail rejects `pending`; remember and report it."""
        state.remember_nack(pending)
        detail = request.error_detail
        message = without_secrets(detail.message)
        record = NackRecord(
            version=pending.version, message=message, at=time.time(),
            nonce=pending.nonce, code=detail.code,
        )  # fmt: skip
        if self.node is not None:
            self._cache.ads_status.nacked(self.node, type_url, record)
        log.warning(
            "node %s NACKed %s version %s: %s",
            self.node_id,
            _short(type_url),
            pending.version,
            message,
        )
        self.answered(type_url, pending, accepted=False)
        if self.node_id is not None:
            self._cache.nacked(self.node_id, type_url, message)

    def note_cluster_changes(self, pending: Pending) -> None:
        """After CDS changed clusters, their endpoints must be sent again (see `resend`)."""
        eds = self.types.get(ENDPOINT)
        if eds is None:
            return
        for name, entry in pending.sent.items():
            before = pending.prev.get(name)
            if before is not None and before != entry:
                service = eds_name(entry.message)
                if service is not None:
                    eds.resend.add(service)

    def take_resend(self, state: TypeState, resources: Mapping[str, ResourceEntry]
                    ) -> dict[str, ResourceEntry]:  # fmt: skip
        """Names to send regardless of what the client has (and forget them)."""
        forced = {
            n: resources[n] for n in state.resend if n in resources and state.sub.wants(n)
        }  # fmt: skip
        state.resend.clear()
        return forced

    def note_serving(self, type_urls: Iterable[str]) -> None:
        """Record, for status, the version of the client's view of its newest snapshot
        (rule 3's hash, as a response would carry it) for each type it subscribes to:
        after a new snapshot and after each request (its subscription may have changed)."""
        snapshot = self.snapshot()
        if snapshot is None or self.node is None:
            return
        for type_url in type_urls:
            state = self.types.get(type_url)
            if state is None:
                continue
            resources = snapshot.resources(type_url)
            view = intern(wanted(resources, state.sub), resources)
            version = self.version_of(view, snapshot, type_url)
            self._cache.ads_status.serving(self.node, type_url, version)

    def record_sent(self, type_url: str, version: str) -> None:
        if self.node is not None:
            self._cache.ads_status.sent(self.node, type_url, version)

    @staticmethod
    def version_of(view: Mapping[str, ResourceEntry], snapshot: Snapshot, type_url: str) -> str:
        """Rule 3: a response's version is the hash of the client's resulting view."""
        if view is snapshot.resources(type_url):
            return snapshot.version(type_url)
        return view_version(view)

    # ----- protocol-specific ---------------------------------------------------------------

    @abc.abstractmethod
    async def _on_request(self, request: Any) -> None: ...

    @abc.abstractmethod
    async def _push(self, type_url: str, phase: Phase) -> Pending | None:
        """Send what `phase` of a push needs for `type_url`; None if nothing."""


def _short(type_url: str) -> str:
    return type_url.rsplit(".", 1)[-1]
