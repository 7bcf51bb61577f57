"""Fixtures: one redis-server for the store tests, fresh key prefixes, an observer."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """Shared by the tests that never stop it; each test writes under its own prefix."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def key_prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


class RecordingObserver:
    """A StoreObserver that remembers every call."""

    def __init__(self) -> None:
        self.latencies: list[tuple[str, float]] = []
        self.failures: list[str] = []
        self.states: list[str] = []
        self.dropped_charges = 0

    def store_latency(self, op: str, seconds: float) -> None:
        self.latencies.append((op, seconds))

    def store_failure(self, op: str) -> None:
        self.failures.append(op)

    def store_state(self, state: str) -> None:
        self.states.append(state)

    def charge_dropped(self) -> None:
        self.dropped_charges += 1


@pytest.fixture
def observer() -> RecordingObserver:
    return RecordingObserver()
