"""Where requests go: `--url http://HOST:PORT` (a base URL; a trailing `/v1` is the API's
own prefix and is not doubled), with TLS for https."""

from __future__ import annotations

import ssl
import urllib.parse
from dataclasses import dataclass

from sluicegate.bench.spec import SpecError


@dataclass(frozen=True)
class Endpoint:
    tls: bool
    host: str
    port: int
    path_prefix: str  # "" or "/prefix", without a trailing slash and without /v1
    host_header: str

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context()
        context.set_alpn_protocols(["http/1.1"])  # the bench speaks HTTP/1.1 only
        return context

    def url(self, path: str) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.host_header}{self.path_prefix}{path}"


def parse_endpoint(url: str) -> Endpoint:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # Not echoed: a value that is no URL may be a key given to the wrong flag.
        raise SpecError("--url", "expected http://HOST:PORT or https://HOST (not shown)")
    if parts.username or parts.password:
        raise SpecError("--url", "credentials in the URL are not sent; use --api-key-env")
    if parts.query or parts.fragment:
        raise SpecError("--url", "give the base URL only, without ?query or #fragment")
    tls = parts.scheme == "https"
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError:
        raise SpecError("--url", f"bad port in the URL of host {parts.hostname}") from None
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    default_port = (tls and port == 443) or (not tls and port == 80)
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    return Endpoint(tls, host, port, path, shown if default_port else f"{shown}:{port}")
