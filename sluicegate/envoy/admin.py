"""A small blocking client for Envoy's admin API, over TCP or a Unix socket (no proxies).

`base_url` is `http://host:port`, or `unix:/path/admin.sock` for an admin served on a
Unix socket (`sluicegate.envoy_admin: unix:/path`, which keeps it from other users).
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from typing import Any, Final

from sluicegate.config import UNIX_PREFIX

_OPENER: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class AdminError(RuntimeError):
    """The admin endpoint could not be reached or answered with an error."""


def admin_base_url(address: str) -> str:
    """The base URL for an admin address as the config or Envoy gives it:
    `host:port`, `unix:/path`, or a bare socket path (Envoy's `--admin-address-path`)."""
    if address.startswith(UNIX_PREFIX):
        return address
    if address.startswith("/"):
        return UNIX_PREFIX + address
    return "http://" + address


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _unix_get(socket_path: str, path: str, timeout: float) -> tuple[int, bytes]:
    connection = _UnixConnection(socket_path, timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def admin_get(base_url: str, path: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of GET `path` on the admin; HTTP error statuses are returned, not raised."""
    try:
        if base_url.startswith(UNIX_PREFIX):
            return _unix_get(base_url[len(UNIX_PREFIX) :], path, timeout)
        with _OPENER.open(base_url + path, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise AdminError(f"Envoy admin {base_url}{path} unreachable: {exc}") from exc


def admin_json(base_url: str, path: str, *, timeout: float = 5.0) -> Any:
    status, body = admin_get(base_url, path, timeout=timeout)
    if status != 200:
        raise AdminError(f"Envoy admin {path} answered {status}: {body[:200]!r}")
    return json.loads(body)


def flatten_stats(document: Any) -> dict[str, int | float | str]:
    """`/stats?format=json` as {name: value} for counters and gauges (histograms skipped)."""
    stats: dict[str, int | float | str] = {}
    for entry in document.get("stats", ()):
        if "name" in entry and "value" in entry:
            stats[entry["name"]] = entry["value"]
    return stats
