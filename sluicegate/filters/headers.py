"""Reading Envoy's HeaderValue: newer Envoys send `raw_value` bytes, older ones `value`."""

from __future__ import annotations

from typing import Any


def header_text(header: Any) -> str:
    """The header's value as text (undecodable bytes kept as surrogates, never lost)."""
    raw: bytes = header.raw_value
    if raw:
        return raw.decode("utf-8", "surrogateescape")
    value: str = header.value
    return value
