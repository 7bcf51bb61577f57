"""Rules for the request headers a provider section names: `headers:` and `forward_headers:`.

A provider receives an allowlist of the client's request headers plus what sluicegate
sets (docs/architecture.md, "What a provider receives"). The YAML may extend the list
(`forward_headers`: names, or `prefix*`) and set fixed headers per provider
(`headers`), but never name a header that sluicegate itself owns: a credential
carrier, a forwarding header, an internal header, a pseudo-header or a hop-by-hop
header. Names are case-insensitive and resolved lower-case (HTTP/2 and Envoy's header
maps use lower case).
"""

from __future__ import annotations

import re
from typing import Final

# RFC 9110 token characters.
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
MAX_NAME_LENGTH: Final = 48
MAX_VALUE_LENGTH: Final = 1024

_CONNECTION: Final = (
    "connection",
    "content-length",
    "expect",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
)
# name -> why the YAML may not name it.
_OWNED: Final = {
    **dict.fromkeys(
        ("authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"),
        "it carries credentials: a client's never reaches a provider, and a provider's key "
        "belongs in api_key",
    ),
    **dict.fromkeys(
        ("forwarded", "x-real-ip"),
        "client forwarding headers never reach a provider",
    ),
    **dict.fromkeys(_CONNECTION, "Envoy sets it for each connection"),
}
_OWNED_PREFIXES: Final = (
    ("x-forwarded-", "client forwarding headers never reach a provider"),
    ("x-sluicegate-", "sluicegate's internal headers never reach a provider"),
    ("x-envoy-", "Envoy's internal headers never reach a provider"),
    (":", "pseudo-headers are Envoy's"),
)


def check_header_name(name: str) -> str:
    """The lower-case name, or ValueError saying why the YAML may not name it."""
    if len(name) > MAX_NAME_LENGTH or not _TOKEN.match(name):
        raise ValueError(
            f"{name!r} is not a header name (letters, digits and !#$%&'*+-.^_`|~, "
            f"at most {MAX_NAME_LENGTH} characters)"
        )
    lower = name.lower()
    reason = _OWNED.get(lower)
    if reason is None:
        reason = next((why for prefix, why in _OWNED_PREFIXES if lower.startswith(prefix)), None)
    if reason is not None:
        raise ValueError(f"header {name!r} may not be named here: {reason}")
    return lower


# Names a provider's fixed `headers` may not set, though a client's may pass: the body's
# media type belongs to the body the client sent (and another provider of the route
# would then get none: xds/translate/forwarded_headers.withheld_headers).
_NOT_FIXED: Final = {"content-type": "it says what the client's body is, which passes as sent"}


def check_fixed_name(name: str) -> str:
    """A `headers` entry's name, lower-case: a header name the YAML may name and that is
    not the client's to describe its own body."""
    lower = check_header_name(name)
    reason = _NOT_FIXED.get(lower)
    if reason is not None:
        raise ValueError(f"header {name!r} may not be set for a provider: {reason}")
    return lower


def check_forwarded_name(name: str) -> str:
    """A `forward_headers` entry, lower-case: a header name, or `prefix*` for every name
    that starts with prefix (e.g. `x-stainless-*`), which must not take in any header the
    YAML may not name."""
    if not name.endswith("*"):
        return check_header_name(name)
    stem = check_header_name(name[:-1]) if len(name) > 2 else ""
    if not stem:
        raise ValueError(f"{name!r}: a prefix needs at least 2 characters before '*'")
    taken = [owned for owned in _OWNED if owned.startswith(stem)]
    taken += [owned + "*" for owned, _ in _OWNED_PREFIXES if owned.startswith(stem)]
    if taken:
        raise ValueError(
            f"{name!r} would take in {', '.join(repr(t) for t in taken)}, which no provider "
            "may receive from a client"
        )
    return stem + "*"


def check_header_value(name: str, value: str) -> str:
    """A header value Envoy sets as written: visible ASCII and inner spaces, no '%'
    (Envoy would read it as a format command)."""
    if value != value.strip() or not value:
        raise ValueError(f"header {name!r}: the value is empty or has surrounding spaces")
    if len(value) > MAX_VALUE_LENGTH:
        raise ValueError(f"header {name!r}: the value is longer than {MAX_VALUE_LENGTH}")
    if any(not (" " <= char <= "~") for char in value) or "%" in value:
        raise ValueError(
            f"header {name!r}: the value may hold only visible ASCII characters and "
            "spaces, and no '%'"
        )
    return value


def check_unique(names: list[str], what: str) -> None:
    """Two spellings of one header (names are case-insensitive) are one mistake."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what} names header {name!r} twice (names ignore case)")
        seen.add(name)
