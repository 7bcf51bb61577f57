"""RedisStore against a real redis-server: the shared cases, atomicity, scripts, keys."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from sluicegate.filters.limiter import Limit, RedisStore, StoreUnavailable, Usage
from tests.ports import free_port
from tests.redis_server import RedisServer

from .cases import CASES, LONG, NOTHING, Harness, limit, tokens
from .conftest import RecordingObserver

pytestmark = pytest.mark.timeout(60)

SHORT = 1.0  # a window these tests wait out: a GC pause or a loaded CI machine must not end it


@pytest.fixture
async def store(redis_server: RedisServer, key_prefix: str) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_server.url, key_prefix=key_prefix, timeout_s=0.5)
    yield store
    await store.close()


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
async def test_shared_case(case: Callable[[Harness], Awaitable[None]], store: RedisStore) -> None:
    await case(Harness(store=store, exact=False, short=SHORT, advance=_sleep, slack=0.1))


async def test_two_replicas_never_admit_more_than_the_limit(
    redis_server: RedisServer, key_prefix: str
) -> None:
    """Two stores with their own connection pools race 64 reserves each on one limit."""
    stores = [RedisStore(redis_server.url, key_prefix=key_prefix, timeout_s=2.0) for _ in range(2)]
    try:
        requests = limit("requests", 50)
        decisions = await asyncio.gather(
            *(
                s.reserve(f"{i}-{j}", [requests], NOTHING)
                for i, s in enumerate(stores)
                for j in range(64)
            )
        )
        assert sum(d.admitted for d in decisions) == 50
        assert max(d.states[0].used for d in decisions) == 50

        budget = limit("tokens", 1000, scope="key")
        rng = random.Random(7)
        sizes = [rng.randint(1, 60) for _ in range(128)]
        decisions = await asyncio.gather(
            *(
                stores[n % 2].reserve(f"t{n}", [budget], tokens(size))
                for n, size in enumerate(sizes)
            )
        )
        admitted = sum(size for size, d in zip(sizes, decisions, strict=True) if d.admitted)
        assert 1000 - 60 < admitted <= 1000
    finally:
        for s in stores:
            await s.close()


async def test_noscript_falls_back_to_eval(store: RedisStore, raw: aioredis.Redis) -> None:
    lim = limit("tokens", 100)
    assert (await store.reserve("a", [lim], tokens(10))).admitted
    assert store.noscript_reloads == 0
    await raw.script_flush()
    assert (await store.reserve("b", [lim], tokens(10))).states[0].used == 20
    assert store.noscript_reloads == 1
    await raw.script_flush()
    assert await store.reconcile("a", tokens(1))
    assert store.noscript_reloads == 2
    assert (await store.reserve("c", [lim], NOTHING)).states[0].used == 11
    assert store.noscript_reloads == 3  # the flush took the reserve script too
    assert (await store.reserve("d", [lim], NOTHING)).states[0].used == 11
    assert await store.reconcile("b", tokens(2))
    assert store.noscript_reloads == 3  # EVAL cached both again


async def test_every_key_is_hash_tagged_and_expires(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    # A window of its own, long enough that a loaded CI machine cannot let the keys
    # expire between the writes and the scan (0.4 s once did).
    window = 2.0
    limits = [
        Limit("tenant", "acme", "tokens", 1000, window),
        Limit("key", "k-1", "requests", 10, window),
        Limit("model", "gpt-4o{x}", "input_tokens", 1000, window),
    ]
    for i in range(3):
        assert (await store.reserve(f"r{i}", limits, Usage(5, 5))).admitted
    assert await store.reconcile("r0", Usage(1, 1))
    assert await store.reconcile("r1", Usage(0, 0))
    written = time.monotonic()

    keys = [key async for key in raw.scan_iter(match=f"*{key_prefix}*", count=1000)]
    assert len(keys) == 2 * len(limits) + 3  # a log and a total per limit, one record each
    assert all(key.startswith(f"sg:{{{key_prefix}}}:") for key in keys)
    assert len({key_slot(key.encode()) for key in keys}) == 1
    for key in keys:
        assert 0 < await raw.pttl(key) <= window * 1000

    await asyncio.sleep(max(0.0, written + window + 0.1 - time.monotonic()))
    assert await raw.exists(*keys) == 0  # idle keys vanish


async def test_key_layout(store: RedisStore, raw: aioredis.Redis, key_prefix: str) -> None:
    lim = Limit("tenant", "acme", "tokens", 100, LONG)
    await store.reserve("rid-1", [lim], Usage(3, 4))
    base = f"sg:{{{key_prefix}}}:"
    assert await raw.zrange(f"{base}l:tenant:acme:tokens:60000", 0, -1) == ["7:rid-1"]
    assert await raw.get(f"{base}t:tenant:acme:tokens:60000") == "7"
    record = await raw.hgetall(f"{base}r:rid-1")
    assert record["e"] == '[["tenant:acme:tokens:60000","tokens",60000,7]]'
    assert "d" not in record
    assert await store.reconcile("rid-1", Usage(1, 1))
    assert await raw.zrange(f"{base}l:tenant:acme:tokens:60000", 0, -1) == ["2:rid-1"]
    assert await raw.hget(f"{base}r:rid-1", "d") == "1"


async def test_a_charge_keeps_the_record_a_reservation_keeps(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    """Same fields and expiry (the longest window) as a reservation's, in the same slot."""
    limits = [
        Limit("tenant", "acme", "tokens", 100, 2.0),
        Limit("key", "k-1", "requests", 10, 5.0),
    ]
    base = f"sg:{{{key_prefix}}}:"
    assert await store.charge("kept", limits, Usage(3, 4))
    assert (await store.reserve("reserved", limits, Usage(3, 4))).admitted
    keys = [key async for key in raw.scan_iter(match=f"*{key_prefix}*", count=1000)]
    assert sorted(k for k in keys if k.startswith(f"{base}r:")) == [
        f"{base}r:kept",
        f"{base}r:reserved",
    ]
    assert len({key_slot(key.encode()) for key in keys}) == 1
    kept, reserved = await raw.hgetall(f"{base}r:kept"), await raw.hgetall(f"{base}r:reserved")
    assert kept.keys() == reserved.keys() == {"t", "e"}
    assert kept["e"] == reserved["e"]
    assert 4000 < await raw.pttl(f"{base}r:kept") <= 5000
    assert await store.reconcile("kept", Usage(1, 1))
    assert await raw.zrange(f"{base}l:tenant:acme:tokens:2000", 0, -1) == [
        "2:kept",
        "7:reserved",
    ]


async def test_a_lost_total_is_rebuilt_from_the_log(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    lim = limit("tokens", 100)
    await store.reserve("a", [lim], tokens(30))
    await store.reserve("b", [lim], tokens(20))
    await raw.delete(f"sg:{{{key_prefix}}}:t:{lim.key}")  # as an eviction would
    d = await store.reserve("c", [lim], tokens(10))
    assert d.admitted and d.states[0].used == 60
    assert await raw.pttl(f"sg:{{{key_prefix}}}:t:{lim.key}") > 0


async def test_observer_hears_latency(
    redis_server: RedisServer, key_prefix: str, observer: RecordingObserver
) -> None:
    store = RedisStore(redis_server.url, key_prefix=key_prefix, observer=observer)
    try:
        await store.reserve("a", [limit("tokens", 10)], tokens(1))
        await store.reconcile("a", tokens(2))
    finally:
        await store.close()
    assert [op for op, _ in observer.latencies] == ["reserve", "reconcile"]
    assert all(seconds > 0 for _, seconds in observer.latencies)
    assert observer.failures == []


async def test_no_redis_raises_fast(key_prefix: str, observer: RecordingObserver) -> None:
    store = RedisStore(
        f"redis://127.0.0.1:{free_port()}/0", key_prefix=key_prefix, observer=observer
    )
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.reserve("a", [limit("tokens", 10)], tokens(1))
        with pytest.raises(StoreUnavailable):
            await store.reconcile("a", tokens(1))
        with pytest.raises(StoreUnavailable):
            await store.ping()
        assert time.monotonic() - started < 1.0
    finally:
        await store.close()
    assert observer.failures == ["reserve", "reconcile"]


async def test_a_hung_redis_times_out(key_prefix: str) -> None:
    with RedisServer() as server:
        store = RedisStore(server.url, key_prefix=key_prefix, timeout_s=0.1)
        try:
            assert (await store.reserve("a", [limit("tokens", 10)], tokens(1))).admitted
            server.pause()
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.reserve("b", [limit("tokens", 10)], tokens(1))
            assert time.monotonic() - started < 1.0
            server.resume()
            d = await store.reserve("c", [limit("tokens", 10)], tokens(1))
            assert d.admitted
        finally:
            server.resume()
            await store.close()


async def test_close_hangs_up_every_pooled_connection(
    redis_server: RedisServer, raw: aioredis.Redis, key_prefix: str
) -> None:
    """A reload replaces the store; the old one must not leave its sockets open."""
    before = len(await raw.client_list())
    store = RedisStore(redis_server.url, key_prefix=key_prefix, timeout_s=2.0)
    lim = limit("requests", 1000)
    await asyncio.gather(*(store.reserve(f"r{i}", [lim], NOTHING) for i in range(8)))
    assert len(await raw.client_list()) > before
    await store.close()
    deadline = time.monotonic() + 5
    while len(await raw.client_list()) > before:
        assert time.monotonic() < deadline, await raw.client_list()
        await asyncio.sleep(0.02)
