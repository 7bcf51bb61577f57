"""Limiter store shared by every sluicegate replica, in Redis.

One Lua script per decision (scripts.py) makes reserve and reconcile atomic
across replicas. A dead or slow Redis must cost a request milliseconds, not
seconds: short socket timeouts, no client retries, and one deadline around
each operation; every failure surfaces as StoreUnavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, NoScriptError, RedisError

from .decision import make_decision
from .model import (
    Decision,
    DuplicateReservation,
    Limit,
    StoreBusy,
    StoreObserver,
    StoreUnavailable,
    Usage,
    check_request,
)
from .scripts import CHARGE, RECONCILE, RESERVE, Script

# Status codes in the reserve script's reply.
_ADMITTED, _REFUSED, _TOO_LARGE, _ID_IN_USE = 1, 0, 2, -1

# Each operation is at most a connect and one or two round trips, each bounded
# by timeout_s; this deadline catches whatever the socket timeouts do not.
_DEADLINE_FACTOR = 3


def _pool_options() -> dict[str, Any]:
    """redis-py 7+ hands out pooled connections the server already closed while its
    "maintenance notifications" are on (the default, "auto"): after a Redis restart each
    old connection fails once, and the limiter would go down again. Off, the pool checks
    and replaces them. Older redis-py has no such option and checks anyway."""
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # pragma: no cover - redis-py before 7
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


_POOL_OPTIONS: Final = _pool_options()


class RedisStore:
    """LimiterStore in Redis (standalone or Cluster: all keys share one slot)."""

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "sluicegate",
        timeout_s: float = 0.1,
        observer: StoreObserver | None = None,
        max_connections: int = 256,
    ) -> None:
        if not key_prefix or set(key_prefix) & set("{}"):
            raise ValueError(f"key_prefix must be non-empty without braces: {key_prefix!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        # A blocking pool: a burst beyond max_connections waits (up to the timeout) for a
        # connection instead of failing at once, which would look like Redis being down.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_error=[],
            **_POOL_OPTIONS,
        )
        # from_pool: the client owns the pool, so close() disconnects its connections too
        # (with `connection_pool=` it would leave them open, one socket leak per reload).
        self._client: aioredis.Redis = aioredis.Redis.from_pool(pool)
        self._base = f"sg:{{{key_prefix}}}:"
        self._deadline_s = timeout_s * _DEADLINE_FACTOR
        self._observer = observer
        self._noscript_reloads = 0

    @property
    def key_base(self) -> str:
        """`sg:{prefix}:`, the start of every key this store writes."""
        return self._base

    @property
    def observer(self) -> StoreObserver | None:
        """Hears the latency and failure of every Redis call this store makes."""
        return self._observer

    @property
    def noscript_reloads(self) -> int:
        """EVALSHA calls answered NOSCRIPT (Redis restarted or flushed its scripts)."""
        return self._noscript_reloads

    async def reserve(
        self, reservation_id: str, limits: Sequence[Limit], estimate: Usage
    ) -> Decision:
        check_request(reservation_id, limits)
        if not limits:
            return make_decision(reservation_id, (), (), (), (), None, False, None, "ok")
        amounts = [estimate.amount(limit.kind) for limit in limits]
        keys: list[str] = []
        for limit in limits:
            keys += (f"{self._base}l:{limit.key}", f"{self._base}t:{limit.key}")
        keys.append(f"{self._base}r:{reservation_id}")
        args: list[str | int] = [reservation_id, _record(limits, amounts)]
        for limit, amount in zip(limits, amounts, strict=True):
            args += (amount, limit.limit, limit.window_ms)

        reply = await self._measured("reserve", RESERVE, keys, args)
        status = int(reply[0])
        if status == _ID_IN_USE:
            raise DuplicateReservation(f"reservation id {reservation_id!r} is in use")
        refused, retry = int(reply[1]), int(reply[2])
        numbers = [int(value) for value in reply[3:]]
        return make_decision(
            reservation_id,
            limits,
            amounts,
            used=numbers[0::2],
            reset_us=numbers[1::2],
            refused=None if status == _ADMITTED else refused - 1,
            too_large=status == _TOO_LARGE,
            retry_us=retry if status == _REFUSED else None,
            store_mode="ok",
        )

    async def reconcile(self, reservation_id: str, actual: Usage) -> bool:
        check_request(reservation_id, ())
        reply = await self._measured(
            "reconcile",
            RECONCILE,
            [f"{self._base}r:{reservation_id}"],
            [
                reservation_id,
                self._base,
                actual.input_tokens,
                actual.output_tokens,
                actual.requests,
            ],
        )
        return int(reply) == 1

    async def charge(self, charge_id: str, limits: Sequence[Limit], usage: Usage) -> bool:
        """Add `usage` to every limit's log now, unchecked, and keep the record a
        reservation keeps (model.LimiterStore.charge)."""
        check_request(charge_id, limits)
        if not limits:
            return True
        amounts = [usage.amount(limit.kind) for limit in limits]
        keys: list[str] = []
        args: list[str | int] = [charge_id, _record(limits, amounts)]
        for limit, amount in zip(limits, amounts, strict=True):
            keys += (f"{self._base}l:{limit.key}", f"{self._base}t:{limit.key}")
            args += (amount, limit.window_ms)
        keys.append(f"{self._base}r:{charge_id}")
        if int(await self._measured("charge", CHARGE, keys, args)) == _ID_IN_USE:
            raise DuplicateReservation(f"charge id {charge_id!r} is in use")
        return True

    async def drop_connections(self) -> None:
        """Close every pooled connection: after Redis restarts, the old ones would each
        fail once on first use (the pool hands them out without noticing)."""
        with contextlib.suppress(RedisError, OSError):
            await self._client.connection_pool.disconnect()

    async def ping(self) -> None:
        """Raise StoreUnavailable unless Redis answers now (FailoverStore's probe)."""
        try:
            async with asyncio.timeout(self._deadline_s):
                await self._client.ping()
        except (RedisError, OSError) as exc:  # TimeoutError is an OSError
            raise StoreUnavailable(f"redis ping failed: {_describe(exc)}") from exc

    async def close(self) -> None:
        await self._client.aclose()

    async def _measured(self, op: str, script: Script, keys: list[str], args: list[Any]) -> Any:
        """Run a script under the deadline; report latency and failure to the observer."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._deadline_s):
                return await self._run(script, keys, args)
        except (RedisError, OSError) as exc:
            if self._observer is not None:
                self._observer.store_failure(op)
            if _pool_exhausted(exc):
                raise StoreBusy(f"redis {op}: {_describe(exc)}") from exc
            raise StoreUnavailable(f"redis {op} failed: {_describe(exc)}") from exc
        finally:
            if self._observer is not None:
                self._observer.store_latency(op, time.perf_counter() - started)

    async def _run(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA, and EVAL with the source when Redis lost its script cache
        (restart, SCRIPT FLUSH, failover to a replica); EVAL caches it again."""
        try:
            return await self._client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            self._noscript_reloads += 1
            return await self._client.eval(script.source, len(keys), *keys, *args)


def _record(limits: Sequence[Limit], amounts: Sequence[int]) -> str:
    """A record's `e` field: what the reconcile script finds each charge by."""
    return json.dumps(
        [
            [limit.key, limit.kind, limit.window_ms, amount]
            for limit, amount in zip(limits, amounts, strict=True)
        ],
        ensure_ascii=False,
        separators=(",", ":"),
    )


def _pool_exhausted(exc: BaseException) -> bool:
    """No pooled connection came free in time (redis-py's wording), or the pool is full."""
    return isinstance(exc, MaxConnectionsError) or (
        isinstance(exc, RedisConnectionError) and "No connection available" in str(exc)
    )


def _describe(exc: BaseException) -> str:
    """`Type: message`; a bare deadline (asyncio's TimeoutError) has no message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
