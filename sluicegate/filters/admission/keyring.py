"""Who is calling: the client key from the request headers, matched to a tenant.

The config holds only salted hashes (`sluicegate hash-key`), one salt per key, so a
presented key is checked against each stored hash until one matches. A match is
remembered by the SHA-256 of the presented key (kept in memory only), so a known client
costs one hash per request; an unknown key is remembered in a bounded set, so a client
retrying a wrong key does not cost a pass over every stored hash each time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from sluicegate import wire
from sluicegate.config import parse_key_hash

_UNKNOWN_REMEMBERED: Final = 4096
_BEARER: Final = "bearer "


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """The tenant and the name of the key that authenticated a request."""

    tenant: str
    key: str


@dataclass(frozen=True, slots=True)
class StoredKey:
    tenant: str
    name: str
    salt: bytes
    digest: bytes


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The client's key: `Authorization: Bearer <key>`, else `x-api-key` or `api-key`
    (the Anthropic and Azure conventions). Header names are lower case (HTTP/2 form)."""
    authorization = headers.get("authorization")
    if authorization is not None:
        if authorization[: len(_BEARER)].lower() == _BEARER:
            key = authorization[len(_BEARER) :].strip()
            return key or None
        return None
    for name in ("x-api-key", "api-key"):
        value = headers.get(name)
        if value is not None:
            return value.strip() or None
    return None


class KeyRing:
    """Stored key hashes → identity, with the memory described in the module docstring."""

    __slots__ = ("_keys", "_known", "_names", "_unknown")

    def __init__(self, keys: Iterable[tuple[str, str, str]]) -> None:
        """`keys`: (tenant, key name, stored hash) triples from a validated config."""
        self._keys: tuple[StoredKey, ...] = tuple(
            StoredKey(tenant, name, *parse_key_hash(hashed)) for tenant, name, hashed in keys
        )
        self._names = frozenset((k.tenant, k.name) for k in self._keys)
        self._known: dict[bytes, ClientIdentity] = {}
        self._unknown: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def named(self, client: str) -> ClientIdentity | None:
        """The identity in the client name Envoy's key check forwarded (wire.client_name),
        when it names a key of this ring: one Envoy still names while a reload removes
        it is refused as the key itself would be."""
        parsed = wire.parse_client_name(client)
        if parsed is None:
            return None
        _lane, tenant, name = parsed
        if (tenant, name) not in self._names:
            return None
        return ClientIdentity(tenant, name)

    def identify(self, key: str) -> ClientIdentity | None:
        """The identity behind `key`, or None when no stored hash matches."""
        raw = key.encode("utf-8", "surrogatepass")
        fingerprint = hashlib.sha256(raw).digest()
        known = self._known.get(fingerprint)
        if known is not None:
            return known
        if fingerprint in self._unknown:
            self._unknown.move_to_end(fingerprint)
            return None
        for stored in self._keys:
            if hmac.compare_digest(hashlib.sha256(stored.salt + raw).digest(), stored.digest):
                identity = ClientIdentity(stored.tenant, stored.name)
                self._known[fingerprint] = identity
                return identity
        self._unknown[fingerprint] = None
        if len(self._unknown) > _UNKNOWN_REMEMBERED:
            self._unknown.popitem(last=False)
        return None
