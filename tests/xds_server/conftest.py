"""Fixtures for the ADS server tests: an in-process server on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sluicegate.xds.server import SnapshotCache, serve_ads

from .helpers import Ads


@pytest.fixture
async def ads() -> AsyncIterator[Ads]:
    cache = SnapshotCache()
    server = await serve_ads(cache, "127.0.0.1:0", ack_timeout=2.0)
    fixture = Ads(cache, server)
    try:
        yield fixture
    finally:
        for raw in fixture.streams:
            raw.close()
        await fixture.channel.close(None)
        await server.stop(None)
