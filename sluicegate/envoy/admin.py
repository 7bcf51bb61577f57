"""A small blocking client for Envoy's admin API (loopback; no proxies)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Final

_OPENER: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class AdminError(RuntimeError):
    """The admin endpoint could not be reached or answered with an error."""


def admin_get(base_url: str, path: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of GET `base_url + path`; HTTP error statuses are returned, not raised."""
    try:
        with _OPENER.open(base_url + path, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError) as exc:
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
