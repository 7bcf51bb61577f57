"""Immutable sets of Envoy resources, versioned by content.

A `Snapshot` is what the control plane wants every Envoy (or one node) to run.
Versions are short content hashes, so they mean the same thing in every
process and survive reconnects and control-plane restarts (rule 3).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from sluicegate.xds.resource import TYPE_PREFIX, resource_name

_VERSION_CHARS = 16


def content_hash(data: bytes) -> str:
    """A short, stable hash: the version of one resource."""
    return hashlib.sha256(data).hexdigest()[:_VERSION_CHARS]


def view_version(entries: Mapping[str, ResourceEntry]) -> str:
    """Rule 3: the version of a set of resources is a hash of its names and versions."""
    digest = hashlib.sha256()
    for name in sorted(entries):
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(entries[name].version.encode())
        digest.update(b"\n")
    return digest.hexdigest()[:_VERSION_CHARS]


@dataclass(frozen=True, eq=False)
class ResourceEntry:
    """One named resource at one version.

    Equality is by (name, version) only, so entries from two snapshots with
    the same content compare equal. `message` is None for placeholders that
    only record a version a client told us it has (delta reconnect).
    """

    type_url: str
    name: str
    version: str
    message: Any = None
    serialized: bytes = field(default=b"", repr=False)

    @classmethod
    def placeholder(cls, type_url: str, name: str, version: str) -> ResourceEntry:
        return cls(type_url, name, version)

    @cached_property
    def any(self) -> any_pb2.Any:
        """The resource packed once, shared by every stream that sends it."""
        return any_pb2.Any(type_url=self.type_url, value=self.serialized)

    @cached_property
    def delta_resource(self) -> Any:
        """The delta wire form (`discovery.v3.Resource`), built once."""
        return discovery_pb2.Resource(name=self.name, version=self.version, resource=self.any)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResourceEntry):
            return NotImplemented
        return self.name == other.name and self.version == other.version

    def __hash__(self) -> int:
        return hash((self.name, self.version))


_EMPTY: Mapping[str, ResourceEntry] = MappingProxyType({})
_EMPTY_VERSION = view_version(_EMPTY)


class Snapshot:
    """An immutable set of resources per type URL, with content-hash versions."""

    __slots__ = ("_resources", "_version", "_versions")

    def __init__(self, resources: Mapping[str, Mapping[str, ResourceEntry]]) -> None:
        self._resources: dict[str, dict[str, ResourceEntry]] = {
            t: dict(entries) for t, entries in resources.items()
        }
        self._versions = {t: view_version(e) for t, e in self._resources.items()}
        overall = hashlib.sha256()
        for t in sorted(self._versions):
            overall.update(f"{t}={self._versions[t]}\n".encode())
        self._version = overall.hexdigest()[:_VERSION_CHARS]

    @classmethod
    def from_resources(cls, resources: Mapping[str, Iterable[Any]]) -> Snapshot:
        """Build a snapshot from Envoy protobuf messages grouped by type URL.

        Rule 11: a name may appear once per type; duplicates raise ValueError,
        as do empty names and messages whose type does not match the key.
        """
        built: dict[str, dict[str, ResourceEntry]] = {}
        for type_url, messages in resources.items():
            if not type_url.startswith(TYPE_PREFIX):
                raise ValueError(f"type URL must start with {TYPE_PREFIX!r}: {type_url!r}")
            entries: dict[str, ResourceEntry] = {}
            for message in messages:
                full_name = message.DESCRIPTOR.full_name
                if TYPE_PREFIX + full_name != type_url:
                    raise ValueError(f"a {full_name} cannot be listed under {type_url}")
                name = resource_name(type_url, message)
                if not name:
                    raise ValueError(f"{full_name} without a name under {type_url}")
                if name in entries:
                    raise ValueError(f"duplicate {full_name} name {name!r}")
                # Deterministic bytes make the hash a function of content only.
                data: bytes = message.SerializeToString(deterministic=True)
                entries[name] = ResourceEntry(type_url, name, content_hash(data), message, data)
            built[type_url] = entries
        return cls(built)

    def version(self, type_url: str | None = None) -> str:
        """The version of one type (hash of its names and versions), or with no
        argument a hash of every type's version: equal snapshots, equal versions.
        An absent type has the version of an empty one."""
        if type_url is None:
            return self._version
        found = self._versions.get(type_url)
        return found if found is not None else _EMPTY_VERSION

    def type_urls(self) -> frozenset[str]:
        return frozenset(self._resources)

    def versions(self) -> dict[str, str]:
        """Type URL → version of that type (hash of its names and versions)."""
        return dict(self._versions)

    def resources(self, type_url: str) -> Mapping[str, ResourceEntry]:
        """Name → entry for one type (empty for an absent type). Do not mutate."""
        return self._resources.get(type_url, _EMPTY)

    def get(self, type_url: str, name: str) -> Any:
        """The message named `name`, or None."""
        entry = self._resources.get(type_url, {}).get(name)
        return None if entry is None else entry.message

    def names(self, type_url: str) -> list[str]:
        return sorted(self._resources.get(type_url, {}))

    def __repr__(self) -> str:
        counts = ", ".join(f"{t.rsplit('.', 1)[-1]}={len(e)}" for t, e in self._resources.items())
        return f"Snapshot({self._version}: {counts})"
