"""Limits the routing stage checks on the request headers, before any body is read.

- Headers: at most wire.MAX_REQUEST_HEADERS headers and wire.MAX_REQUEST_HEADERS_KB KiB,
  counted as Envoy counts them (every entry, pseudo-headers included; key plus value
  bytes). Envoy's own limit is higher by a headroom for what the gateway adds later
  (wire.py), so the client gets an OpenAI 431 here instead of Envoy's 500 when the
  routing stage's header mutation would cross Envoy's limit.
- `content-length` above `limits.max_request_body_bytes`: 413 at once. Envoy would
  otherwise wait for (and buffer) the body until its buffer limit or the client gives up.
- A credential in the query string (wire.QUERY_CREDENTIALS: `?api_key=…`) is removed
  from `:path`, so no provider sees it (the fast lane's model readers apply the same
  rule: xds/translate/model_reader.py). Only names are decoded to compare them; the
  query is otherwise kept byte for byte (Envoy's own query mutation decodes and does not
  re-encode values, which would corrupt `%26` and could make a new parameter of it).
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple
from urllib.parse import unquote_to_bytes

from sluicegate import wire

from .responses import immediate_error

_MAX_HEADER_BYTES: Final = wire.MAX_REQUEST_HEADERS_KB * 1024

TOO_MANY_HEADERS: Final = immediate_error(
    431,
    f"The request has too many headers: the gateway accepts at most "
    f"{wire.MAX_REQUEST_HEADERS}, counting those it adds on arrival.",
    code="request_headers_too_large",
)
HEADERS_TOO_LARGE: Final = immediate_error(
    431,
    f"The request's headers are too large: the gateway accepts at most "
    f"{wire.MAX_REQUEST_HEADERS_KB} KiB of headers.",
    code="request_headers_too_large",
)


def body_too_large(max_body_bytes: int) -> bytes:
    """413 for a declared body above the limit (the same words as Envoy's own 413)."""
    return immediate_error(
        413,
        f"Request body is larger than the gateway's limit of {max_body_bytes} bytes",
        code="request_too_large",
    )


class HeaderCheck(NamedTuple):
    """What the routing stage makes of request headers: a refusal (431, 413), or the
    `:path` to send on instead of the client's (credentials removed), or neither."""

    refusal: bytes | None = None
    path: bytes | None = None


PASSED: Final = HeaderCheck()


def check_headers(message: Any, max_body_bytes: int | None, too_large: bytes) -> HeaderCheck:
    """Check a `HttpHeaders` message. `too_large` is body_too_large(max_body_bytes), built
    once by the caller's table."""
    headers = message.headers.headers
    if len(headers) > wire.MAX_REQUEST_HEADERS:
        return HeaderCheck(TOO_MANY_HEADERS)
    size = 0
    declared: bytes | None = None
    path: bytes | None = None
    for header in headers:
        key = header.key
        raw = header.raw_value or header.value.encode()  # older Envoys send `value`
        size += len(key) + len(raw)
        if key == "content-length":
            declared = raw
        elif key == ":path":
            path = raw
    if size > _MAX_HEADER_BYTES:
        return HeaderCheck(HEADERS_TOO_LARGE)
    if declared is not None and max_body_bytes is not None:
        # Envoy's codec has already refused a content-length that is not a number.
        text = declared.strip()
        if text.isdigit() and int(text) > max_body_bytes:
            return HeaderCheck(too_large)
    if path is not None and b"?" in path:
        cleaned = without_query_credentials(path)
        if cleaned is not None:
            return HeaderCheck(path=cleaned)
    return PASSED


def without_query_credentials(path: bytes) -> bytes | None:
    """`path` with every wire.QUERY_CREDENTIALS parameter removed, or None when it has
    none. A parameter's name is decoded (`api%5Fkey`, `API-Key` are `api_key`) only to be
    compared; what is kept is kept as sent. The rule, byte for byte, of the fast lane's
    model readers too (xds/translate/model_reader.py, native/c/model_filter.c)."""
    target, _, query = path.partition(b"?")
    if not target:
        return None  # all query: Envoy passes no such path (every one starts with `/`)
    parts = query.split(b"&")
    kept = [part for part in parts if credential_name(part) not in _CREDENTIALS]
    if len(kept) == len(parts):
        return None
    return target + b"?" + b"&".join(kept) if kept else target


_CREDENTIALS: Final = frozenset(name.encode() for name in wire.QUERY_CREDENTIALS)


def credential_name(part: bytes) -> bytes:
    """A query parameter's name as compared with wire.QUERY_CREDENTIALS: the bytes before
    its first `=`, `+` read as a space and each `%XX` as its byte (any other `%` kept),
    ASCII whitespace trimmed, ASCII letters in lower case, `-` read as `_`."""
    name = unquote_to_bytes(part.partition(b"=")[0].replace(b"+", b" "))
    return name.strip(b" \t\n\v\f\r").lower().replace(b"-", b"_")
