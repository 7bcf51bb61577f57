"""Redis frozen, killed and brought back under load (issue 4): no request hangs, the
answers follow `admission.store.on_failure`, and counting in Redis resumes.

One real Envoy in front of two ext_proc processes (the main one and one replica, round
robin per request) sharing a real redis-server. Every tenant has the same limit, LIMIT
requests per WINDOW_S; the local fallback (`replicas: 2`) gives each process LIMIT / 2.
For each mode, in one stack:

1. Redis up: the shared limit holds across both processes (LIMIT+1th is 429).
2. Redis frozen (SIGSTOP) while CLIENTS clients send a steady stream: a request pays at
   most about one store timeout, and none once the store is known down; the answers
   follow the mode (fail_open: 200; fail_closed: 503 rate_limiter_unavailable; local:
   LIMIT / 2 per process, LIMIT in all per window). After SIGCONT each process logs one
   "up" line and counts in Redis again, one client or several at once.
3. Redis killed under the same stream: every request ends within BOUND_S, and the
   answers follow the mode.
4. Redis restarted on the same port: each process logs one "up" line after its probe,
   /metrics counts each state change once, and decisions are counted in Redis again,
   one client or several at once.

Each phase uses its own tenant, so no phase sees another's charges: besides, a frozen
Redis still runs, once resumed, a reserve that timed out in its socket (a charge for a
request the fallback already decided).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from sluicegate.config import hash_key
from tests.e2e.stack import Stack, own_addresses, running_stack
from tests.ports import free_ports
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

LIMIT = 6  # requests per WINDOW_S, per tenant
WINDOW_S = 4.0
REPLICAS = 2  # ext_proc processes: the main one and one replica
LOCAL_SHARE = LIMIT // REPLICAS
TIMEOUT_S = 0.1  # admission.store.timeout (the default, written out)
PROBE_S = 1.0  # FailoverStore's probe interval (the default)
CLIENTS = 4
PACE_S = 0.02  # a client's pause between two requests
BOUND_S = 3.0  # no request may take longer, whatever Redis does
FROZEN_BOUND_S = 1.0  # a frozen Redis costs a request at most this much
RECOVERY_S = 3 * PROBE_S + 2.0  # Redis back -> every process counting in it again
# Charges are compared by send time; admission happens a little later. Windows are
# shortened by this much when counting admissions "in one window".
SLACK_S = 0.5
TENANTS = ("before", "pause", "resume", "resume-load", "kill", "restart", "restart-load")
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
DOWN_LINE = "limiter store down"
UP_LINE = "limiter store up: counting in Redis again"


def api_key(tenant: str) -> str:
    return f"sk-test-outage-{tenant}-0123456789abcdef"


def document(replica: str, store: dict[str, Any]) -> dict[str, Any]:
    listen, alpha = free_ports(2)
    return {
        "version": 1,
        "sluicegate": own_addresses(ext_proc_replicas=[replica]),
        "admission": {"store": store},
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "providers": [
            {
                "name": "alpha",
                "base_url": f"http://127.0.0.1:{alpha}/v1",
                "mock": {"models": [], "ttft_ms": 5, "itl_ms": 0, "output_tokens": 4},
            }
        ],
        "routes": [{"name": "chat", "models": ["chat"], "backends": [{"provider": "alpha"}]}],
        "tenants": [
            {
                "name": tenant,
                "rate_limits": {"requests": LIMIT, "per": f"{WINDOW_S:g}s"},
                "keys": [{"name": f"{tenant}-key", "hash": hash_key(api_key(tenant))}],
            }
            for tenant in TENANTS
        ],
    }


# ----- what a client saw -------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """When a test action (kill, pause, ...) began and when it returned."""

    began: float
    ended: float


@dataclass
class Answer:
    sent: float  # time.monotonic() when the request left
    elapsed: float
    status: int  # 0: no answer within the client's own (generous) timeout
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def limit_told(self) -> str | None:
        """The requests limit the answer names: LIMIT from Redis, LOCAL_SHARE from the
        local fallback, anything else is the mock provider's own header passing through."""
        return self.headers.get("x-ratelimit-limit-requests")

    @property
    def code(self) -> str | None:
        error = self.body.get("error")
        return error.get("code") if isinstance(error, dict) else None

    def describe(self) -> str:
        shown = {
            k: v
            for k, v in self.headers.items()
            if k.startswith("x-ratelimit") or k == "retry-after"
        }
        return f"{self.status} {self.code} after {self.elapsed:.3f}s {shown}"


async def send(session: aiohttp.ClientSession, gateway: str, tenant: str) -> Answer:
    sent = time.monotonic()
    headers = {"authorization": f"Bearer {api_key(tenant)}"}
    try:
        async with session.post(
            gateway + "/v1/chat/completions", json=BODY, headers=headers
        ) as response:
            raw = await response.read()
            status = response.status
            answer_headers = {k.lower(): v for k, v in response.headers.items()}
    except TimeoutError:
        return Answer(sent, time.monotonic() - sent, 0)
    body = json.loads(raw) if raw else {}
    return Answer(sent, time.monotonic() - sent, status, body, answer_headers)


def session() -> aiohttp.ClientSession:
    # Longer than BOUND_S, so a slow answer is measured rather than cut short.
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2 * BOUND_S))


async def stream_during(
    gateway: str,
    tenant: str,
    duration_s: float,
    events: list[tuple[float, Callable[[], None]]],
) -> tuple[list[Answer], dict[str, Event]]:
    """CLIENTS clients send requests for duration_s; each action (at its offset) runs in a
    thread meanwhile. Returns the answers and, per action name, when it ran."""
    answers: list[Answer] = []
    done: dict[str, Event] = {}
    start = time.monotonic()
    deadline = start + duration_s
    async with session() as http:

        async def client() -> None:
            while time.monotonic() < deadline:
                answers.append(await send(http, gateway, tenant))
                await asyncio.sleep(PACE_S)

        async def run_events() -> None:
            for offset, action in events:
                await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
                began = time.monotonic()
                await asyncio.to_thread(action)
                done[action.__name__] = Event(began, time.monotonic())

        await asyncio.gather(run_events(), *(client() for _ in range(CLIENTS)))
    return answers, done


def sequential(stack: Stack, tenant: str, count: int) -> list[Answer]:
    async def run() -> list[Answer]:
        async with session() as http:
            return [await send(http, stack.gateway, tenant) for _ in range(count)]

    return asyncio.run(run())


# ----- what the gateway shows ----------------------------------------------------------------


def metrics_text(stack: Stack) -> str:
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
        return text


MAIN = {"ext_proc": "main"}  # the main server's samples on up's /metrics


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include those given (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            total += float(match.group(3))
    return total


def admitted_by_main(stack: Stack) -> float:
    """up's /metrics labels each ext_proc server's samples (stack/ext_proc_metrics.py)."""
    return metric_sum(
        metrics_text(stack), "sluicegate_admission_decisions_total", outcome="admitted", **MAIN
    )


def logs(stack: Stack) -> dict[str, str]:
    """The main process's log (`sluicegate up`) and the replica's, by name."""
    replica = stack.config_path.parent / "work" / "ext-proc-0.log"
    return {"main": stack.log(), "replica": replica.read_text(errors="replace")}


def state_lines(stack: Stack) -> dict[str, tuple[int, int]]:
    """Per process: how many "down" and "up" lines the limiter logged."""
    return {
        name: (text.count(DOWN_LINE), text.count(UP_LINE)) for name, text in logs(stack).items()
    }


def wait_for_lines(
    stack: Stack, down: int, up: int, timeout_s: float
) -> dict[str, tuple[int, int]]:
    """Until both processes logged `down` downs and `up` ups (or timeout_s passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = state_lines(stack)
        if all(counts == (down, up) for counts in lines.values()):
            return lines
        if time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def redis_log_size(server: RedisServer, tenant: str) -> int:
    """Charges in Redis's sliding-window log of the tenant's requests limit."""
    client = redis.Redis.from_url(server.url, socket_timeout=2)
    try:
        keys = list(client.scan_iter(match=f"sg:*:l:tenant:{tenant}:requests:*"))
        assert len(keys) <= 1, keys
        return int(client.zcard(keys[0])) if keys else 0
    finally:
        client.close()


# ----- checks ----------------------------------------------------------------------------------


def assert_limit_holds_in_redis(stack: Stack, server: RedisServer, tenant: str) -> None:
    """LIMIT requests pass, the next is 429, counted once across both processes in Redis."""
    before = admitted_by_main(stack)
    answers = sequential(stack, tenant, LIMIT + 1)
    admitted, refused = answers[:LIMIT], answers[LIMIT]
    assert [a.status for a in admitted] == [200] * LIMIT, [a.describe() for a in answers]
    # Shared counting: the limit is the global one, and what remains goes down by one per
    # request whichever process decided it.
    assert [a.headers.get("x-ratelimit-limit-requests") for a in admitted] == [str(LIMIT)] * LIMIT
    remaining = [int(a.headers["x-ratelimit-remaining-requests"]) for a in admitted]
    assert remaining == list(range(LIMIT - 1, -1, -1)), remaining
    assert refused.status == 429, refused.describe()
    assert refused.code == "rate_limit_exceeded"
    assert refused.body["error"]["type"] == "requests"
    assert 1 <= int(refused.headers["retry-after"]) <= WINDOW_S
    assert refused.headers["x-ratelimit-limit-requests"] == str(LIMIT)
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # Both processes took part (Envoy balances ext_proc streams round robin).
    by_main = admitted_by_main(stack) - before
    assert 0 < by_main < LIMIT, f"main process admitted {by_main} of {LIMIT}"
    assert redis_log_size(server, tenant) == LIMIT


def assert_counted_in_redis_under_load(
    stack: Stack, server: RedisServer, tenant: str, lines: dict[str, tuple[int, int]]
) -> None:
    """CLIENTS concurrent clients for one second (less than a window): every answer is
    decided in Redis, LIMIT are admitted in all, and no process changes state."""
    answers, _ = asyncio.run(stream_during(stack.gateway, tenant, 1.0, []))
    not_redis = [
        a.describe() for a in answers if a.status not in (200, 429) or a.limit_told != str(LIMIT)
    ]
    assert not not_redis, (
        f"{len(not_redis)} of {len(answers)} answers not decided in Redis (state lines "
        f"before {lines}, now {state_lines(stack)}): {not_redis[:5]}"
    )
    assert sum(a.status == 200 for a in answers) == LIMIT
    assert redis_log_size(server, tenant) == LIMIT
    assert state_lines(stack) == lines


def worst_window(admitted_at: list[float]) -> int:
    """Most admissions sent within any interval of WINDOW_S - SLACK_S."""
    times = sorted(admitted_at)
    return max(
        (
            sum(1 for t in times[i:] if t < start + WINDOW_S - SLACK_S)
            for i, start in enumerate(times)
        ),
        default=0,
    )


def assert_mode(mode: str, answers: list[Answer], outage: Event, until: float) -> None:
    """Requests sent after the store went away (until `until`) are answered as `mode`
    says. Those in flight when it went were decided either way; in local mode their
    local charges count too."""
    after = [a for a in answers if outage.ended <= a.sent and a.sent + a.elapsed < until]
    assert len(after) >= 20, f"too few requests during the outage: {len(after)}"
    statuses = sorted({a.status for a in after})
    if mode == "fail_open":
        assert statuses == [200], statuses
        # Nothing was counted, so the gateway tells of no limit of its own (the mock
        # provider's own x-ratelimit-* headers pass through).
        told = [a.describe() for a in after if a.limit_told in (str(LIMIT), str(LOCAL_SHARE))]
        assert not told, told
    elif mode == "fail_closed":
        assert statuses == [503], statuses
        for a in after:
            assert a.code == "rate_limiter_unavailable", a.describe()
            assert a.body["error"]["type"] == "server_error", a.describe()
            assert int(a.headers["retry-after"]) >= 1, a.describe()
    else:
        # (Requests in flight when the store went may have used up both shares already.)
        assert statuses in ([429], [200, 429]), statuses
        # Each process counts alone against its share of the limit...
        for a in after:
            assert a.limit_told == str(LOCAL_SHARE), a.describe()
            if a.status == 429:
                assert a.code == "rate_limit_exceeded", a.describe()
                assert a.body["error"]["type"] == "requests", a.describe()
                assert int(a.headers["retry-after"]) >= 1, a.describe()
        # ...so together they admit at most the global limit in any window, and both of
        # them admit: the first window of the outage holds the sum of both shares.
        local = sorted(
            a.sent
            for a in answers
            if a.status == 200 and a.limit_told == str(LOCAL_SHARE) and a.sent < until
        )
        shown = [round(t - outage.began, 3) for t in local]
        assert 0 < worst_window(local) <= LIMIT, shown
        first = [t for t in local if t < local[0] + WINDOW_S - SLACK_S]
        assert len(first) == REPLICAS * LOCAL_SHARE, shown


# ----- the test --------------------------------------------------------------------------------


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.parametrize("mode", ["fail_open", "fail_closed", "local"])
def test_redis_outage_follows_the_mode_and_counting_resumes(
    tmp_path: Path, redis_server: RedisServer, mode: str
) -> None:
    (replica,) = free_ports(1)
    store = {
        "kind": "redis",
        "url": redis_server.url,
        "timeout": f"{TIMEOUT_S * 1000:g}ms",
        "on_failure": mode,
        "replicas": REPLICAS,
    }
    changes = "sluicegate_limiter_store_state_changes_total"
    with running_stack(tmp_path, document(f"127.0.0.1:{replica}", store)) as stack:
        # 1. Redis up: the limit is shared by both processes.
        assert_limit_holds_in_redis(stack, redis_server, "before")
        assert state_lines(stack) == {"main": (0, 0), "replica": (0, 0)}

        # 2. Redis frozen (the port accepts, nothing answers) under a steady stream.
        def pause() -> None:
            redis_server.pause()

        def resume() -> None:
            redis_server.resume()

        answers, done = asyncio.run(
            stream_during(stack.gateway, "pause", 2.5, [(0.3, pause), (2.3, resume)])
        )
        slow = [a.describe() for a in answers if not 0 < a.elapsed < FROZEN_BOUND_S]
        assert not slow, slow
        # Once a process knows the store is down, no request waits on it any more (no
        # timeout per request): only those in flight when each process noticed paid it.
        settled = [a for a in answers if done["pause"].ended + 0.5 <= a.sent < done["resume"].began]
        waited = [
            (round(a.sent - done["pause"].ended, 3), a.describe())
            for a in settled
            if a.elapsed >= TIMEOUT_S
        ]
        assert len(waited) <= len(settled) // 4, waited
        # SIGSTOP is asynchronous: a request sent at once may still be answered by Redis.
        frozen = Event(done["pause"].began, done["pause"].ended + 0.05)
        assert_mode(mode, answers, frozen, until=done["resume"].began)
        assert "TimeoutError" in logs(stack)["main"]  # it went down because Redis froze

        # Resumed: the probe finds it, counting resumes, also under concurrency.
        lines = wait_for_lines(stack, down=1, up=1, timeout_s=RECOVERY_S)
        assert lines == {"main": (1, 1), "replica": (1, 1)}, lines
        assert_limit_holds_in_redis(stack, redis_server, "resume")
        assert_counted_in_redis_under_load(stack, redis_server, "resume-load", lines)

        # 3. Redis killed under a steady stream: nothing hangs, the mode decides.
        def kill() -> None:
            redis_server.stop()

        answers, done = asyncio.run(
            stream_during(stack.gateway, "kill", 0.5 + WINDOW_S + 0.5, [(0.5, kill)])
        )
        slow = [a.describe() for a in answers if not 0 < a.elapsed < BOUND_S or a.status == 0]
        assert not slow, slow
        before_kill = [a for a in answers if a.sent + a.elapsed < done["kill"].began]
        assert before_kill, "no request finished before the kill"
        assert {a.status for a in before_kill} == {200, 429}, [a.describe() for a in before_kill]
        assert_mode(mode, answers, done["kill"], until=math.inf)
        assert redis_server.running is False
        lines = state_lines(stack)
        assert lines == {"main": (2, 1), "replica": (2, 1)}, lines

        # 4. Redis restarted on the same port: the probe finds it, counting resumes.
        redis_server.restart()
        restarted = time.monotonic()
        lines = wait_for_lines(stack, down=2, up=2, timeout_s=RECOVERY_S)
        assert lines == {"main": (2, 2), "replica": (2, 2)}, (
            f"after {time.monotonic() - restarted:.1f}s: {lines}"
        )
        assert_limit_holds_in_redis(stack, redis_server, "restart")
        text = metrics_text(stack)
        assert metric_sum(text, changes, state="down", **MAIN) == 2
        assert metric_sum(text, changes, state="up", **MAIN) == 2
        assert metric_sum(text, "sluicegate_limiter_store_failures_total", **MAIN) >= 2
        if mode == "fail_closed":
            refused = metric_sum(
                text, "sluicegate_admission_decisions_total", outcome="store_unavailable"
            )
            assert refused >= 1
        # Nothing crashed along the way.
        assert stack.process.poll() is None
        for name, text in logs(stack).items():
            assert "Traceback" not in text, f"{name} log:\n{text[-3000:]}"
        # A restarted Redis is a new server: connections to the old one must not fail
        # requests (nor switch the store down again) once it answers.
        assert_counted_in_redis_under_load(stack, redis_server, "restart-load", lines)
