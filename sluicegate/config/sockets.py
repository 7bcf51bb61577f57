"""No two sockets that `sluicegate up` opens may share a port.

Envoy listeners, sluicegate's own servers (xDS, ext_proc, HTTP, Envoy admin) and
the mock providers it starts all bind on this machine. An Envoy admin on a Unix socket
(`unix:/path`) takes no port, so it is left out. A real provider's base_url
must not point at one of the first two either (a request would loop).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from .addresses import collide, split_host_port
from .admin_address import parse_admin_address
from .document import Document
from .problems import Problem
from .source import KeyPath, Locator, format_key_path


@dataclass(frozen=True)
class _Socket:
    kind: Literal["sluicegate", "listener", "mock"]
    what: str
    host: str
    port: int
    path: KeyPath
    line: int  # 0 for defaults that are not written in the file

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def check_sockets(doc: Document, at: Locator) -> Iterable[Problem]:
    sockets = sorted(_sockets(doc, at), key=lambda s: s.line)
    yield from _collisions(sockets, at)
    yield from _loops(doc, [s for s in sockets if s.kind != "mock"], at)


def _collisions(sockets: list[_Socket], at: Locator) -> Iterable[Problem]:
    for index, socket in enumerate(sockets):
        clash = next((s for s in sockets[:index] if collide(_pair(s), _pair(socket))), None)
        if clash is None:
            continue
        where = f"at {format_key_path(clash.path)}, line {clash.line}" if clash.line else "default"
        yield at.error(
            socket.path,
            f"{socket.what} on {socket.address} collides with {clash.what} on "
            f"{clash.address} ({where})",
        )


def _loops(doc: Document, ours: list[_Socket], at: Locator) -> Iterable[Problem]:
    """A real provider's base_url must not point back at Envoy or at sluicegate itself."""
    for p, provider in doc.providers:
        if provider.mock is not None:
            continue
        parts = urlsplit(provider.base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = (parts.hostname or "", port)
        clash = next((s for s in ours if collide(_pair(s), target)), None)
        if clash is not None:
            if clash.kind == "listener":
                hint = "requests would loop back into Envoy"
            else:
                hint = "that is not an LLM provider"
            yield at.error(
                ("providers", p, "base_url"),
                f"base_url points at {clash.what} on {clash.address}; {hint}",
            )


def _pair(socket: _Socket) -> tuple[str, int]:
    return socket.host, socket.port


def _sockets(doc: Document, at: Locator) -> Iterable[_Socket]:
    for name, address in doc.addresses.items():
        path: KeyPath = ("sluicegate", name)
        if name == "envoy_admin" and parse_admin_address(address).is_unix:
            continue
        host, port = split_host_port(address)
        line = at.source.line_of(path) if at.source.has(path) else 0
        yield _Socket("sluicegate", f"sluicegate.{name}", host, port, path, line)
    for index, address in doc.replica_addresses:
        path = ("sluicegate", "ext_proc_replicas", index)
        host, port = split_host_port(address)
        line = at.source.line_of(path) if at.source.has(path) else 0
        yield _Socket("sluicegate", f"ext_proc replica {index}", host, port, path, line)
    for i, listener in doc.listeners:
        path = ("listeners", i, "port")
        line = at.source.line_of(path)
        yield _Socket(
            "listener", f"listener '{listener.name}'", listener.address, listener.port, path, line
        )
    for p, provider in doc.providers:
        if provider.mock is None:
            continue
        parts = urlsplit(provider.base_url)
        if parts.hostname is None or parts.port is None:
            continue  # reported by the mock URL rule
        path = ("providers", p, "base_url")
        what = f"mock provider '{provider.name}'"
        yield _Socket("mock", what, parts.hostname, parts.port, path, at.source.line_of(path))
