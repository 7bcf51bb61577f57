"""A small ADS client that behaves like Envoy on the wire: it subscribes,
applies and ACKs what it gets, NACKs on demand, and records everything.

For tests and for benchmarks that hold hundreds of simulated Envoy streams;
the gateway never uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

# Register the resource types this client decodes (Any -> message needs the classes
# imported somewhere; a benchmark process may import nothing else of Envoy's API).
from envoy.config.cluster.v3 import cluster_pb2  # noqa: F401
from envoy.config.core.v3 import extension_pb2  # noqa: F401
from envoy.config.endpoint.v3 import endpoint_pb2  # noqa: F401
from envoy.config.listener.v3 import listener_pb2  # noqa: F401
from envoy.config.route.v3 import route_pb2  # noqa: F401
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2  # noqa: F401
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, symbol_database
from google.rpc import status_pb2

from sluicegate.xds.resource import FULL_STATE_TYPES, resource_name

#: End of stream marker of grpc.aio (missing from grpc-stubs).
GRPC_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]

#: Decides whether to reject a response: (type_url, version) → error message or None.
NackPolicy = Callable[[str, str], str | None]


@dataclass(frozen=True)
class Received:
    """One response as the client saw it."""

    type_url: str
    version: str
    nonce: str
    names: tuple[str, ...]
    removed: tuple[str, ...]
    accepted: bool
    at: float


class AdsClient:
    """An ADS client speaking SotW (default) or delta on one stream."""

    def __init__(
        self,
        target: str,
        node_id: str,
        *,
        cluster: str = "sluicegate-test",
        delta: bool = False,
        channel: grpc.aio.Channel | None = None,
        nack_policy: NackPolicy | None = None,
    ) -> None:
        self.target = target
        self.node_id = node_id
        self.cluster = cluster
        self.delta = delta
        self.nack_policy = nack_policy
        self._own_channel = channel is None
        self._channel = channel
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        # grpc.aio allows one write in flight per call; ACKs and subscriptions share it.
        self._write_lock = asyncio.Lock()
        self._nack_next: dict[str, str] = {}
        self._sent_node = False
        #: Subscribed names per type (SotW: the list sent; delta: the set).
        self.subscriptions: dict[str, list[str]] = {}
        #: What the client holds: type → name → packed resource.
        self.resources: dict[str, dict[str, any_pb2.Any]] = {}
        #: Delta: type → name → resource version.
        self.resource_versions: dict[str, dict[str, str]] = {}
        #: Last accepted version per type (SotW version_info / delta system_version_info).
        self.versions: dict[str, str] = {}
        self.received: list[Received] = []
        self.error: BaseException | None = None

    # ----- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> AdsClient:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:  # fmt: skip
        await self.close()

    async def connect(self) -> None:
        """Open the stream and (re)send every subscription, like Envoy after a reconnect."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                self.target,
                options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
            )
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self._channel)
        self._call = (
            stub.DeltaAggregatedResources() if self.delta else stub.StreamAggregatedResources()
        )
        self._sent_node = False
        self._reader = asyncio.create_task(self._read())
        for type_url, names in self.subscriptions.items():
            await self._initial_request(type_url, names)

    async def reconnect(self) -> None:
        """Drop the stream and open a new one, keeping what was received."""
        await self._close_call()
        await self.connect()

    async def close(self) -> None:
        await self._close_call()
        if self._own_channel and self._channel is not None:
            await self._channel.close(None)
            self._channel = None

    async def _close_call(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None

    # ----- requests --------------------------------------------------------------------------

    async def subscribe(self, type_url: str, names: Iterable[str] = ()) -> None:
        """SotW: set the type's name list (empty on first use = wildcard for
        LDS/CDS). Delta: add names (empty on first use = wildcard for LDS/CDS)."""
        names = list(names)
        first = type_url not in self.subscriptions
        if self.delta:
            current = self.subscriptions.setdefault(type_url, [])
            current.extend(n for n in names if n not in current)
            if first:
                await self._initial_request(type_url, names)
            else:
                await self._write(discovery_pb2.DeltaDiscoveryRequest(
                    type_url=type_url, resource_names_subscribe=names))  # fmt: skip
        else:
            self.subscriptions[type_url] = names
            await self._write(self._sotw_request(type_url))

    async def unsubscribe(self, type_url: str, names: Iterable[str]) -> None:
        names = list(names)
        current = self.subscriptions.setdefault(type_url, [])
        self.subscriptions[type_url] = [n for n in current if n not in names]
        for name in names:
            self.resources.get(type_url, {}).pop(name, None)
            self.resource_versions.get(type_url, {}).pop(name, None)
        if self.delta:
            await self._write(discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, resource_names_unsubscribe=names))  # fmt: skip
        else:
            await self._write(self._sotw_request(type_url))

    def nack_next(self, type_url: str, message: str = "rejected by test") -> None:
        """Reject the next response of this type."""
        self._nack_next[type_url] = message

    async def _initial_request(self, type_url: str, names: list[str]) -> None:
        if self.delta:
            await self._write(discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, resource_names_subscribe=names,
                initial_resource_versions=self.resource_versions.get(type_url, {}),
            ))  # fmt: skip
        else:
            await self._write(self._sotw_request(type_url))

    def _sotw_request(self, type_url: str, nonce: str = "") -> Any:
        return discovery_pb2.DiscoveryRequest(
            type_url=type_url,
            version_info=self.versions.get(type_url, ""),
            resource_names=self.subscriptions.get(type_url, []),
            response_nonce=nonce,
        )

    async def _write(self, request: Any) -> None:
        async with self._write_lock:
            if not self._sent_node:
                # Like Envoy: only the first request on a stream names the node.
                request.node.id = self.node_id
                request.node.cluster = self.cluster
                self._sent_node = True
            await self._call.write(request)

    # ----- responses -------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                response = await self._call.read()
                if response is GRPC_EOF:
                    break
                await self._apply(response)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # recorded for tests; the stream is over
            self.error = err
        async with self._changed:
            self._changed.notify_all()

    async def _apply(self, response: Any) -> None:
        type_url: str = response.type_url
        version = response.system_version_info if self.delta else response.version_info
        reason = self._nack_next.pop(type_url, None)
        if reason is None and self.nack_policy is not None:
            reason = self.nack_policy(type_url, version)
        names = tuple(self._name_of(r) for r in response.resources)
        removed = tuple(response.removed_resources) if self.delta else ()
        if reason is None:
            self._store(type_url, response)
            self.versions[type_url] = version
        self.received.append(Received(type_url, version, response.nonce, names, removed,
                                      reason is None, time.monotonic()))  # fmt: skip
        error = None if reason is None else status_pb2.Status(code=3, message=reason)
        if self.delta:
            ack = discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, response_nonce=response.nonce
            )
            if error is not None:
                ack.error_detail.CopyFrom(error)
        else:
            ack = self._sotw_request(type_url, response.nonce)
            if error is not None:
                ack.error_detail.CopyFrom(error)
        await self._write(ack)
        async with self._changed:
            self._changed.notify_all()

    def _name_of(self, resource: Any) -> str:
        if self.delta:
            name: str = resource.name
            return name
        return _unpacked_name(resource)

    def _store(self, type_url: str, response: Any) -> None:
        held = self.resources.setdefault(type_url, {})
        if self.delta:
            versions = self.resource_versions.setdefault(type_url, {})
            for name in response.removed_resources:
                held.pop(name, None)
                versions.pop(name, None)
            for resource in response.resources:
                held[resource.name] = resource.resource
                versions[resource.name] = resource.version
            return
        if type_url in FULL_STATE_TYPES:
            held.clear()  # xDS: missing from a full-state response = deleted
        for packed in response.resources:
            held[_unpacked_name(packed)] = packed

    # ----- waiting ---------------------------------------------------------------------------

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until `predicate()` holds (checked after every response)."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: predicate() or self._reader_done())
        if not predicate():
            raise ConnectionError(f"ADS stream ended: {self.error!r}")

    def _reader_done(self) -> bool:
        return self._reader is None or self._reader.done()

    async def wait_version(self, type_url: str, version: str, timeout: float = 5.0) -> None:
        await self.wait_for(lambda: self.versions.get(type_url) == version, timeout)

    def count(self, type_url: str | None = None) -> int:
        """Responses received (of one type, or all)."""
        return sum(1 for r in self.received if type_url is None or r.type_url == type_url)

    def message(self, type_url: str, name: str) -> Any:
        """A held resource, decoded."""
        return _decode(self.resources[type_url][name])


def _decode(packed: any_pb2.Any) -> Any:
    full_name = packed.type_url.rsplit("/", 1)[-1]
    cls = symbol_database.Default().GetSymbol(full_name)
    message = cls()
    packed.Unpack(message)
    return message


def _unpacked_name(packed: any_pb2.Any) -> str:
    return resource_name(packed.type_url, _decode(packed))
