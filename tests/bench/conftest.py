"""Fixtures: a mock provider and a fixed-answer upstream on free ports, each in a thread
of its own, so a `sluicegate bench` subprocess or the bench's own loop can reach them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sluicegate.bench.fixed_upstream import Options
from sluicegate.provider import MockProviderSettings, ThreadedMockProvider
from tests.bench.helpers import SECRET, ThreadedUpstream


@pytest.fixture
def mock() -> Iterator[ThreadedMockProvider]:
    """Streams of 7 tokens, 20 ms to the first, 2 ms apart; any model; no key."""
    settings = MockProviderSettings(ttft_ms=20, itl_ms=2, output_tokens=7, models=["m1", "m2"])
    with ThreadedMockProvider(settings) as provider:
        yield provider


@pytest.fixture
def keyed_mock() -> Iterator[ThreadedMockProvider]:
    settings = MockProviderSettings(ttft_ms=5, itl_ms=1, output_tokens=3, api_key=SECRET,
                                    models=["m1"])  # fmt: skip
    with ThreadedMockProvider(settings) as provider:
        yield provider


@pytest.fixture
def start_upstream() -> Iterator[Any]:
    started: list[ThreadedUpstream] = []

    def start(**fields: Any) -> ThreadedUpstream:
        upstream = ThreadedUpstream(Options(**fields))
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        upstream.close()
