"""AdsClient against the server, and many streams in one process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import grpc

from sluicegate.testing import AdsClient
from sluicegate.xds.resource import CLUSTER, ENDPOINT, LISTENER, ROUTE

from .helpers import Ads, snapshot


async def test_client_sotw_acks_nacks_and_reconnects(ads: Ads) -> None:
    first = snapshot(["a", "b"])
    ads.cache.set_snapshot(first)
    async with AdsClient(ads.target, "c1") as client:
        await client.subscribe(CLUSTER)
        await client.subscribe(ENDPOINT, ["a", "b"])
        await client.subscribe(LISTENER)
        await client.subscribe(ROUTE, ["r"])
        await client.wait_for(lambda: len(client.versions) == 4)
        assert client.versions == first.versions()
        assert client.message(ENDPOINT, "b").cluster_name == "b"
        await asyncio.sleep(0.1)  # let the ACKs land
        [status] = ads.cache.status()
        assert status.acked_versions() == first.versions()

        client.nack_next(CLUSTER, "nope")
        bad = snapshot(["a", "b", "c"])
        ads.cache.set_snapshot(bad)
        await client.wait_for(lambda: any(not r.accepted for r in client.received))
        assert client.versions[CLUSTER] == first.version(CLUSTER)
        await asyncio.sleep(0.1)
        [status] = ads.cache.status()
        assert status.current_nacks()[CLUSTER].message == "nope"

        # A reconnect presents the accepted versions; only what differs is sent.
        before = client.count()
        await client.reconnect()
        await client.wait_version(CLUSTER, bad.version(CLUSTER))
        new = client.received[before:]
        assert [r.type_url for r in new] == [CLUSTER]
        assert sorted(client.resources[CLUSTER]) == ["a", "b", "c"]


async def test_client_delta_reconnect_sends_only_differences(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b"]))
    client = AdsClient(ads.target, "d1", delta=True)
    await client.connect()
    try:
        await client.subscribe(CLUSTER)
        await client.wait_for(lambda: len(client.resources.get(CLUSTER, {})) == 2)
        ads.cache.set_snapshot(snapshot(["a", "b", "c"]))
        await client.close()
        # While away, c appeared; a and b are unchanged.
        await client.connect()
        await client.wait_for(lambda: "c" in client.resources[CLUSTER])
        last = client.received[-1]
        assert last.names == ("c",) and last.accepted
        await asyncio.sleep(0.1)
        assert client.count(CLUSTER) == 2
    finally:
        await client.close()


def has_cds(client: AdsClient) -> Callable[[], bool]:
    return lambda: CLUSTER in client.versions


async def test_thousand_streams_all_get_one_push(ads: Ads) -> None:
    """1,000 streams on a few connections: each gets the change exactly once."""
    ads.cache.set_snapshot(snapshot(["a"]))
    channels = [grpc.aio.insecure_channel(ads.target) for _ in range(4)]
    clients = [
        AdsClient(ads.target, f"node-{i}", channel=channels[i % 4], delta=bool(i % 2))
        for i in range(1000)
    ]
    try:
        await asyncio.gather(*(c.connect() for c in clients))
        await asyncio.gather(*(c.subscribe(CLUSTER) for c in clients))
        await asyncio.gather(*(c.wait_for(has_cds(c), 30) for c in clients))
        assert len(ads.cache.status()) == 1000
        changed = snapshot(["a", "b"])
        ads.cache.set_snapshot(changed)
        await asyncio.gather(
            *(c.wait_version(CLUSTER, changed.version(CLUSTER), 30) for c in clients)
        )
        await asyncio.sleep(0.2)
        assert all(c.count(CLUSTER) == 2 for c in clients)
        json.dumps([s.to_dict() for s in ads.cache.status()])
    finally:
        await asyncio.gather(*(c.close() for c in clients))
        await asyncio.gather(*(ch.close(None) for ch in channels))
    async with asyncio.timeout(10):
        while ads.cache.status():
            await asyncio.sleep(0.05)
    assert len(ads.cache.status(include_disconnected=True)) == 1000
