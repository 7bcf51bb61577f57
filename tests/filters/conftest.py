"""Fixtures: a real ExtProcServer on a free 127.0.0.1 port and a channel to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from sluicegate.filters import ExtProcServer

from .helpers import CHANNEL_OPTIONS, TABLE


@pytest.fixture
async def ext_proc() -> AsyncIterator[ExtProcServer]:
    server = ExtProcServer(TABLE)
    await server.start("127.0.0.1:0")
    try:
        yield server
    finally:
        await server.stop(0)


@pytest.fixture
async def channel(ext_proc: ExtProcServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(ext_proc.address, options=CHANNEL_OPTIONS) as channel:
        yield channel
