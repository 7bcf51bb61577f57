"""FailoverStore with a redis-server that the test stops and restarts."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from sluicegate.filters.limiter import (
    DuplicateReservation,
    FailoverStore,
    OnFailure,
    RedisStore,
    Usage,
)
from tests.redis_server import RedisServer

from .cases import NOTHING, limit, tokens
from .conftest import RecordingObserver
from .tcp_gate import TcpGate

pytestmark = pytest.mark.timeout(60)

PROBE_S = 0.1
LOGGER = "sluicegate.limiter"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def make_store(
    server: RedisServer,
    key_prefix: str,
    on_failure: OnFailure,
    observer: RecordingObserver,
    *,
    replicas: int = 1,
    failures_to_down: int = 1,
) -> FailoverStore:
    """Down at the first failure (unless told otherwise): the cases below are about what
    happens once down; test_down_takes_failures_in_a_row covers the threshold."""
    return FailoverStore(
        RedisStore(server.url, key_prefix=key_prefix, timeout_s=0.1),
        on_failure=on_failure,
        replicas=replicas,
        probe_interval_s=PROBE_S,
        observer=observer,
        failures_to_down=failures_to_down,
    )


async def wait_until_up(store: FailoverStore, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while store.state != "up":
        assert time.monotonic() < deadline, "the probe never found Redis again"
        await asyncio.sleep(0.02)


def state_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.fixture
async def closing() -> AsyncIterator[list[FailoverStore]]:
    stores: list[FailoverStore] = []
    yield stores
    for store in stores:
        await store.close()


@pytest.mark.parametrize(
    ("on_failure", "admitted"), [("fail_open", True), ("fail_closed", False), ("local", True)]
)
async def test_down_decides_by_policy_then_comes_back(
    on_failure: OnFailure,
    admitted: bool,
    server: RedisServer,
    key_prefix: str,
    observer: RecordingObserver,
    caplog: pytest.LogCaptureFixture,
    closing: list[FailoverStore],
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = make_store(server, key_prefix, on_failure, observer)
    closing.append(store)
    lim = limit("requests", 100)
    d = await store.reserve("before", [lim], NOTHING)
    assert d.admitted and d.store_mode == "ok"

    server.stop()
    for i in range(20):
        started = time.monotonic()
        d = await store.reserve(f"down-{i}", [lim], NOTHING)
        assert time.monotonic() - started < 1.0
        assert d.store_mode == on_failure and d.admitted is admitted
        if on_failure == "local":
            assert d.states[0].used == i + 1
        else:
            assert d.states == () and d.refused_by is None and d.retry_after_s is None
    assert store.state == "down"
    # Only the first request met the dead Redis: no per-request timeouts, one line.
    assert observer.failures == ["reserve"]
    assert observer.states == ["down"]
    assert len(state_lines(caplog)) == 1
    assert on_failure in state_lines(caplog)[0]

    server.start()  # the same port
    await wait_until_up(store)
    d = await store.reserve("after", [lim], NOTHING)
    assert d.store_mode == "ok" and d.admitted
    assert d.states[0].used == 1  # counting resumed in Redis (which restarted empty)
    assert observer.states == ["down", "up"]
    assert len(state_lines(caplog)) == 2
    assert observer.failures == ["reserve"]


async def test_local_mode_divides_limits_by_replicas(
    server: RedisServer,
    key_prefix: str,
    observer: RecordingObserver,
    closing: list[FailoverStore],
) -> None:
    store = make_store(server, key_prefix, "local", observer, replicas=2)
    closing.append(store)
    requests = limit("requests", 4)
    budget = limit("tokens", 3, scope="key")  # 3 // 2 = 1
    tiny = limit("tokens", 1, scope="model")  # never below 1
    server.stop()
    admitted = [(await store.reserve(f"r{i}", [requests], NOTHING)).admitted for i in range(3)]
    assert admitted == [True, True, False]
    d = await store.reserve("x", [requests], NOTHING)
    assert d.store_mode == "local" and d.refused_by is not None
    assert d.refused_by.limit == 2 and d.refused_by.key == requests.key
    assert d.states[0].limit.limit == 2 and d.retry_after_s is not None

    d = await store.reserve("b", [budget, tiny], tokens(1))
    assert d.admitted and [s.limit.limit for s in d.states] == [1, 1]


async def test_reconcile_while_down(
    server: RedisServer,
    key_prefix: str,
    observer: RecordingObserver,
    closing: list[FailoverStore],
) -> None:
    store = make_store(server, key_prefix, "local", observer)
    closing.append(store)
    lim = limit("tokens", 100)
    assert (await store.reserve("in-redis", [lim], tokens(50))).store_mode == "ok"
    server.stop()
    d = await store.reserve("local-1", [lim], tokens(50))
    assert d.store_mode == "local" and d.states[0].used == 50
    assert await store.reconcile("local-1", tokens(10))
    assert await store.reconcile("local-1", tokens(10)) is False
    # Made in Redis, which is gone: dropped and counted, without touching Redis.
    assert await store.reconcile("in-redis", tokens(10)) is False
    assert store.dropped_reconciles == 1
    assert observer.failures == ["reserve"]
    d = await store.reserve("local-2", [lim], tokens(30))
    assert d.states[0].used == 40

    server.start()
    await wait_until_up(store)
    assert (await store.reserve("in-redis-2", [lim], tokens(5))).store_mode == "ok"
    # A reservation made locally is still reconciled locally once Redis is back.
    assert await store.reconcile("local-2", tokens(0))
    assert await store.reconcile("in-redis-2", tokens(1))
    assert store.dropped_reconciles == 1


async def test_reconcile_failure_switches_down(
    server: RedisServer,
    key_prefix: str,
    observer: RecordingObserver,
    caplog: pytest.LogCaptureFixture,
    closing: list[FailoverStore],
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = make_store(server, key_prefix, "fail_open", observer)
    closing.append(store)
    lim = limit("tokens", 100)
    await store.reserve("a", [lim], tokens(5))
    server.stop()
    assert await store.reconcile("a", Usage(1, 1)) is False
    assert store.state == "down" and store.dropped_reconciles == 1
    assert observer.failures == ["reconcile"]
    assert (await store.reserve("b", [lim], tokens(5))).store_mode == "fail_open"
    assert observer.failures == ["reconcile"]
    assert len(state_lines(caplog)) == 1


async def test_one_observer_for_both_stores_counts_once(
    server: RedisServer, key_prefix: str, observer: RecordingObserver
) -> None:
    redis = RedisStore(server.url, key_prefix=key_prefix, timeout_s=0.1, observer=observer)
    store = FailoverStore(
        redis,
        on_failure="fail_open",
        probe_interval_s=PROBE_S,
        observer=observer,
        failures_to_down=1,
    )
    try:
        await store.reserve("a", [limit("tokens", 10)], tokens(1))
        assert [op for op, _ in observer.latencies] == ["reserve"]
        server.stop()
        await store.reserve("b", [limit("tokens", 10)], tokens(1))
        assert observer.failures == ["reserve"]
        assert [op for op, _ in observer.latencies] == ["reserve", "reserve"]
        assert observer.states == ["down"]
    finally:
        await store.close()


async def test_a_hung_redis_costs_one_timeout(
    server: RedisServer,
    key_prefix: str,
    observer: RecordingObserver,
    closing: list[FailoverStore],
) -> None:
    store = make_store(server, key_prefix, "fail_closed", observer)
    closing.append(store)
    lim = limit("tokens", 100)
    await store.reserve("a", [lim], tokens(1))
    server.pause()
    try:
        started = time.monotonic()
        decisions = await asyncio.gather(
            *(store.reserve(f"b{i}", [lim], tokens(1)) for i in range(10))
        )
        assert time.monotonic() - started < 1.0
        assert {d.store_mode for d in decisions} == {"fail_closed"}
        assert observer.states == ["down"]
    finally:
        server.resume()
    await wait_until_up(store)
    assert (await store.reserve("c", [lim], tokens(1))).store_mode == "ok"


async def test_down_takes_failures_in_a_row_and_a_success_resets_the_count(
    server: RedisServer,
    key_prefix: str,
    observer: RecordingObserver,
    closing: list[FailoverStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = make_store(server, key_prefix, "fail_closed", observer, failures_to_down=3)
    closing.append(store)
    lim = limit("tokens", 100)
    server.pause()  # every call now times out
    try:
        for rid in ("a", "b"):
            decision = await store.reserve(rid, [lim], tokens(1))
            assert decision.store_mode == "fail_closed"  # decided by the fallback...
            assert store.state == "up"  # ...but not down yet
    finally:
        server.resume()
    assert (await store.reserve("c", [lim], tokens(1))).store_mode == "ok"  # count reset
    server.pause()
    try:
        for rid in ("d", "e"):
            await store.reserve(rid, [lim], tokens(1))
        assert store.state == "up"
        await store.reserve("f", [lim], tokens(1))
        assert store.state == "down"
    finally:
        server.resume()
    assert len(state_lines(caplog)) == 1


async def test_no_free_connection_is_not_redis_down(
    server: RedisServer, key_prefix: str, observer: RecordingObserver
) -> None:
    """More concurrent calls than pooled connections: the excess waits, and one that
    still finds none in time is decided by the fallback without marking Redis down."""
    # 0.5 s: the 64 calls below queue on two connections; on a loaded machine 0.1 s
    # was not always enough for the last of them to get one.
    redis = RedisStore(server.url, key_prefix=key_prefix, timeout_s=0.5, max_connections=2)
    store = FailoverStore(
        redis, on_failure="fail_closed", probe_interval_s=PROBE_S, failures_to_down=1
    )
    pool = redis._client.connection_pool  # the test holds both connections itself
    try:
        lim = limit("tokens", 10_000)
        held = [await pool.get_connection() for _ in range(2)]
        try:
            # Redis answers; only the pool is full. One failure would be "down" if counted.
            decision = await store.reserve("busy", [lim], tokens(1))
        finally:
            for connection in held:
                await pool.release(connection)
        assert decision.store_mode == "fail_closed"
        assert store.state == "up"
        # The excess waits for a connection rather than failing:
        decisions = await asyncio.gather(
            *(store.reserve(f"s{i}", [lim], tokens(1)) for i in range(64))
        )
        assert {d.store_mode for d in decisions} == {"ok"}
        assert store.state == "up"
    finally:
        await store.close()


async def test_a_call_that_fails_while_redis_answers_others_is_not_redis_down(
    server: RedisServer, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A burst on a loaded replica: the pooled connections answer, the new ones it opens
    time out. Redis answered during those calls, so it is not down: each failed call is
    decided by the fallback, and the replica keeps counting in Redis."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with TcpGate(server.port, admit=2) as gate:
        store = FailoverStore(
            RedisStore(gate.url, key_prefix=key_prefix, timeout_s=0.2),
            on_failure="fail_closed",
            probe_interval_s=PROBE_S,
            failures_to_down=3,
        )
        try:
            lim = limit("tokens", 10_000)
            # Two connections that work, and stay pooled.
            warm = await asyncio.gather(*(store.reserve(f"w{i}", [lim], tokens(1)) for i in (1, 2)))
            assert [d.store_mode for d in warm] == ["ok", "ok"]
            # Two calls get those; ten open new connections, which hang.
            burst = await asyncio.gather(
                *(store.reserve(f"b{i}", [lim], tokens(1)) for i in range(12))
            )
            modes = [d.store_mode for d in burst]
            assert (modes.count("ok"), modes.count("fail_closed")) == (2, 10)
            assert store.state == "up"  # ten failures, more than 3, but Redis was answering
            gate.open()  # the load is gone: new connections complete again
            after = await asyncio.gather(
                *(store.reserve(f"a{i}", [lim], tokens(1)) for i in range(12))
            )
            assert {d.store_mode for d in after} == {"ok"}
            assert state_lines(caplog) == []
        finally:
            await store.close()


@pytest.mark.parametrize(("on_failure", "counted"), [("fail_open", False), ("local", True)])
async def test_a_charge_goes_to_redis_then_by_policy_while_down(
    on_failure: OnFailure,
    counted: bool,
    server: RedisServer,
    key_prefix: str,
    observer: RecordingObserver,
    closing: list[FailoverStore],
) -> None:
    """A request admitted elsewhere (model.LimiterStore.charge): over a full window in
    Redis; while Redis is down, counted in the local store at each replica's share with
    `local`, else dropped (and counted as dropped, the observer told of each)."""
    store = make_store(server, key_prefix, on_failure, observer, replicas=2)
    closing.append(store)
    lim = limit("tokens", 100)
    assert (await store.reserve("full", [lim], tokens(100))).admitted
    assert await store.charge("fast-1", [lim], tokens(30))
    d = await store.reserve("next", [lim], NOTHING)
    assert d.store_mode == "ok" and not d.admitted and d.states[0].used == 130

    server.stop()
    assert await store.charge("fast-2", [lim], tokens(10)) is counted  # meets the dead Redis
    assert await store.charge("fast-3", [lim], tokens(60)) is counted  # already down
    assert store.state == "down"
    assert observer.failures == ["charge"]
    assert store.dropped_charges == observer.dropped_charges == (0 if counted else 2)
    d = await store.reserve("down", [lim], NOTHING)
    if counted:
        # The local share is 100 // 2: the 70 charged locally fill it and more.
        assert d.store_mode == "local" and not d.admitted and d.states[0].used == 70
    else:
        assert d.store_mode == "fail_open" and d.admitted


@pytest.mark.parametrize("on_failure", ["fail_open", "fail_closed", "local"])
async def test_a_charge_is_reconciled_where_it_was_kept(
    on_failure: OnFailure,
    server: RedisServer,
    key_prefix: str,
    observer: RecordingObserver,
    closing: list[FailoverStore],
) -> None:
    """A running request's charge (model.LimiterStore.charge): in Redis while
    it is up; while down, with `local`, kept in the local store, reconciled there even
    once Redis is back and not charged in Redis again; else dropped, nothing to reconcile."""
    store = make_store(server, key_prefix, on_failure, observer, replicas=2)
    closing.append(store)
    lim = limit("tokens", 100)
    assert await store.charge("up", [lim], tokens(60))
    with pytest.raises(DuplicateReservation):
        await store.charge("up", [lim], tokens(60))
    assert await store.reconcile("up", tokens(20))
    assert await store.reconcile("up", tokens(30)) is False
    d = await store.reserve("r1", [lim], NOTHING)
    assert d.store_mode == "ok" and d.states[0].used == 20

    server.stop()
    kept = on_failure == "local"
    assert await store.charge("d1", [lim], tokens(40)) is kept
    assert await store.charge("d2", [lim], tokens(5)) is kept
    assert store.state == "down" and store.dropped_charges == (0 if kept else 2)
    assert await store.reconcile("d1", tokens(45)) is kept
    if kept:
        with pytest.raises(DuplicateReservation):
            await store.charge("d1", [lim], tokens(40))
        d = await store.reserve("r2", [lim], NOTHING)
        assert d.store_mode == "local" and d.states[0].used == 50  # 45 + 5, at the share

    server.start()  # empty again
    await wait_until_up(store)
    if kept:
        # Redis does not hold d2, but it is in use: a later in-flight record of it must
        # not charge it in Redis as well.
        with pytest.raises(DuplicateReservation):
            await store.charge("d2", [lim], tokens(5))
    else:
        assert await store.charge("d2", [lim], tokens(5))  # first count
    d = await store.reserve("r3", [lim], NOTHING)
    assert d.store_mode == "ok" and d.states[0].used == (0 if kept else 5)
    assert await store.reconcile("d2", tokens(8)) is True
    assert await store.reconcile("d1", tokens(1)) is False  # done, or never kept
    d = await store.reserve("r4", [lim], NOTHING)
    assert d.states[0].used == (0 if kept else 8)
