"""Counters that tests read back through GET /mock/stats."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Never echo credentials back: these headers (and anything that looks like them) are left
# out of the recorded header subset.
_SECRET_MARKERS = ("authorization", "api-key", "apikey", "cookie", "secret", "password")
RECENT_LIMIT = 50


def safe_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        name.lower(): value
        for name, value in headers.items()
        if not any(marker in name.lower() for marker in _SECRET_MARKERS)
    }


@dataclass
class RequestRecord:
    method: str
    path: str
    model: str | None
    stream: bool
    authorization_present: bool
    headers: dict[str, str]
    at: float = field(default_factory=time.time)
    status: int | None = None
    fault: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "model": self.model,
            "stream": self.stream,
            "authorization_present": self.authorization_present,
            "headers": self.headers,
            "at": self.at,
            "status": self.status,
            "fault": self.fault,
        }


@dataclass
class ProviderStats:
    """Per-provider counters; only touched from the server's event loop."""

    name: str
    requests_total: int = 0
    connections_total: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    by_fault: Counter[str] = field(default_factory=Counter)
    by_model: Counter[str] = field(default_factory=Counter)
    recent: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=RECENT_LIMIT))

    def reset(self) -> None:
        self.requests_total = 0
        self.connections_total = 0
        self.max_in_flight = self.in_flight
        self.by_status.clear()
        self.by_fault.clear()
        self.by_model.clear()
        self.recent.clear()

    def connection_opened(self) -> None:
        self.connections_total += 1

    def request_started(self, record: RequestRecord) -> None:
        self.requests_total += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if record.model is not None:
            self.by_model[record.model] += 1
        self.recent.append(record)

    def request_finished(self) -> None:
        self.in_flight -= 1

    def status_sent(self, record: RequestRecord, status: int) -> None:
        record.status = status
        self.by_status[str(status)] += 1

    def fault_injected(self, record: RequestRecord, fault: str) -> None:
        record.fault = fault
        self.by_fault[fault] += 1

    def snapshot(self, *, connections_open: int) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests_total": self.requests_total,
            "by_status": dict(self.by_status),
            "by_fault": dict(self.by_fault),
            "by_model": dict(self.by_model),
            "connections_total": self.connections_total,
            "connections_open": connections_open,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "last_request": self.recent[-1].as_json() if self.recent else None,
            "recent_requests": [record.as_json() for record in self.recent],
        }
