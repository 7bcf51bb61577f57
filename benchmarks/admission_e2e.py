"""Parts 2b, 3 and 4 of benchmarks/admission.py: a real Envoy in front of mock providers,
through `sluicegate up` (benchmarks.harness.stack)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import aiohttp

from benchmarks.admission_stack import (
    counter_delta,
    get_json,
    histogram_delta,
    histogram_quantile,
    metrics,
    sleep_or_stop,
)
from benchmarks.harness.answers import error_code
from benchmarks.harness.stack import UpStack, addresses, start_stacks
from benchmarks.harness.stats import percentile
from sluicegate.config import hash_key
from sluicegate.filters.request_facts import inspect_request
from sluicegate.testing import free_ports

REQUEST_TIMEOUT_S: Final = 30.0


def _key(name: str) -> str:
    return f"sk-bench-{name}-0123456789abcdef"


def _tenant(
    name: str, limits: dict[str, Any] | None = None, priority: str | None = None
) -> dict[str, Any]:
    tenant: dict[str, Any] = {
        "name": name,
        "keys": [{"name": f"{name}-key", "hash": hash_key(_key(name))}],
    }
    if limits is not None:
        tenant["rate_limits"] = limits
    if priority is not None:
        tenant["priority"] = priority
    return tenant


def _headers(tenant: str) -> dict[str, str]:
    return {"content-type": "application/json", "authorization": f"Bearer {_key(tenant)}"}


def _session(clients: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=clients, limit_per_host=clients)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    )


# ----- part 2b: a streamed response with the usage observer on vs off ------------------------

OBS_TOKENS: Final = 50
OBS_ITL_MS: Final = 10
OBS_TTFT_MS: Final = 50
OBS_VARIANTS: Final = ("off", "on")
OBS_LABELS: Final = {
    "off": "observer off (tenant with a requests limit only)",
    "on": "observer on (tenant with tokens + requests limits)",
}


def observer_doc(variant: str) -> dict[str, Any]:
    listen, mock = free_ports(2)
    limits: dict[str, Any] = {"requests": 1_000_000_000, "per": "1m"}
    if variant == "on":
        limits["tokens"] = 1_000_000_000_000
    return {
        "version": 1,
        "admission": {"lane": "exact"},  # the routing stage (the default is lane_rules.py's)
        "sluicegate": addresses(),
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "providers": [
            {
                "name": "alpha",
                "base_url": f"http://127.0.0.1:{mock}/v1",
                "mock": {
                    "models": [],
                    "ttft_ms": OBS_TTFT_MS,
                    "itl_ms": OBS_ITL_MS,
                    "output_tokens": OBS_TOKENS,
                },
            }
        ],
        "routes": [{"name": "chat", "models": ["chat"], "backends": [{"provider": "alpha"}]}],
        "tenants": [_tenant("bench", limits)],
    }


@dataclass
class StreamSample:
    ttft_s: float
    total_s: float
    gaps_s: list[float]
    events: int


@dataclass
class ObserverE2E:
    clients: int
    round_s: float
    rounds: int
    samples: dict[str, list[StreamSample]] = field(default_factory=dict)
    failures: dict[str, Counter[str]] = field(default_factory=dict)
    cpu_s: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> role -> s
    usage_reports: dict[str, float] = field(default_factory=dict)  # observer's usage reports
    round_ratios: dict[str, list[float]] = field(default_factory=dict)  # metric -> per round

    def all_gaps(self, variant: str) -> list[float]:
        return [gap for sample in self.samples[variant] for gap in sample.gaps_s]


STREAM_BODY: Final = json.dumps(
    {
        "model": "chat",
        "messages": [{"role": "user", "content": "Write a short poem about sluice gates."}],
        "max_tokens": 64,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
).encode()


async def _stream_clients(
    url: str, clients: int, seconds: float
) -> tuple[list[StreamSample], Counter[str]]:
    samples: list[StreamSample] = []
    failures: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    headers = _headers("bench")
    async with _session(clients) as session:

        async def client() -> None:
            while time.monotonic() < deadline:
                sent = time.perf_counter()
                try:
                    async with session.post(url, data=STREAM_BODY, headers=headers) as response:
                        if response.status != 200:
                            failures[f"{response.status} {error_code(await response.read())}"] += 1
                            continue
                        times = []
                        async for line in response.content:
                            if line.startswith(b"data:"):
                                times.append(time.perf_counter())
                        end = time.perf_counter()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    failures[type(exc).__name__] += 1
                    continue
                if len(times) < OBS_TOKENS:
                    failures["short stream"] += 1
                    continue
                tokens = times[:OBS_TOKENS]
                gaps = [b - a for a, b in itertools.pairwise(tokens)]
                samples.append(StreamSample(tokens[0] - sent, end - sent, gaps, len(times)))

        await asyncio.gather(*(client() for _ in range(clients)))
    return samples, failures


def _observer_level(
    stacks: dict[str, UpStack], clients: int, round_s: float, rounds: int
) -> ObserverE2E:
    result = ObserverE2E(clients, round_s, rounds)
    for variant in OBS_VARIANTS:
        result.samples[variant] = []
        result.failures[variant] = Counter()
        result.cpu_s[variant] = defaultdict(float)
    before = {v: metrics(stacks[f"observer-{v}"].http + "/metrics") for v in OBS_VARIANTS}
    for index in range(rounds):
        order = OBS_VARIANTS if index % 2 == 0 else OBS_VARIANTS[::-1]
        per_round: dict[str, list[StreamSample]] = {}
        for variant in order:
            stack = stacks[f"observer-{variant}"]
            cpu0 = stack.cpu()
            samples, failures = asyncio.run(
                _stream_clients(stack.url + "/v1/chat/completions", clients, round_s)
            )
            cpu1 = stack.cpu()
            for role in cpu1:
                result.cpu_s[variant][role] += cpu1[role] - cpu0.get(role, 0.0)
            result.samples[variant] += samples
            result.failures[variant] += failures
            per_round[variant] = samples
            print(
                f"  {clients} clients, round {index + 1}, observer {variant}: {len(samples)} "
                f"streams, TTFT p50 {percentile([s.ttft_s for s in samples], 50) * 1e3:.1f} ms",
                flush=True,
            )
        picks: list[tuple[str, Callable[[list[StreamSample]], float]]] = [
            ("ttft_p50", lambda s: percentile([x.ttft_s for x in s], 50)),
            ("gap_p50", lambda s: percentile([g for x in s for g in x.gaps_s], 50)),
            ("gap_p99", lambda s: percentile([g for x in s for g in x.gaps_s], 99)),
            ("total_p50", lambda s: percentile([x.total_s for x in s], 50)),
        ]
        for name, pick in picks:
            result.round_ratios.setdefault(name, []).append(
                pick(per_round["on"]) / pick(per_round["off"])
            )
    for variant in OBS_VARIANTS:
        after = metrics(stacks[f"observer-{variant}"].http + "/metrics")
        result.usage_reports[variant] = counter_delta(
            before[variant], after, "sluicegate_usage_reports_total", {}
        )
    return result


def run_observer_e2e(work: Path, levels: list[tuple[int, float]], rounds: int) -> list[ObserverE2E]:
    """Both stacks up at once; per (clients, round seconds) level, rounds alternating."""
    docs = {f"observer-{v}": observer_doc(v) for v in OBS_VARIANTS}
    stacks = start_stacks(work, docs, _key("bench"), "chat")
    try:
        return [_observer_level(stacks, clients, round_s, rounds) for clients, round_s in levels]
    finally:
        for stack in stacks.values():
            stack.stop()


# ----- part 3: over-admission at the real window ---------------------------------------------

WINDOW_LIMIT: Final = 10_000
WINDOW_MAX_TOKENS: Final = 200
WINDOW_BODY: Final = json.dumps(
    {
        "model": "chat",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": WINDOW_MAX_TOKENS,
    }
).encode()
# Admission happens between a client's send and its answer; charges are placed at send
# time here, so windows shortened by this much absorb the timing (as the e2e test does).
SLACK_S: Final = 0.3
REFUSED_PAUSE_S: Final = 0.1


def window_doc(per: str, redis_url: str, replicas: int) -> dict[str, Any]:
    listen, mock, *extra = free_ports(2 + replicas - 1)
    sluicegate = addresses()
    sluicegate["ext_proc_replicas"] = [f"127.0.0.1:{port}" for port in extra]
    return {
        "version": 1,
        "sluicegate": sluicegate,
        "admission": {
            "lane": "exact",
            "store": {
                "kind": "redis",
                "url": redis_url,
                "replicas": replicas,
                "on_failure": "fail_closed",
            }
        },
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "providers": [
            {
                "name": "alpha",
                "base_url": f"http://127.0.0.1:{mock}/v1",
                # Every answer uses all of max_tokens: real usage is close to the estimate.
                "mock": {
                    "models": [],
                    "ttft_ms": 30,
                    "itl_ms": 0,
                    "output_tokens": WINDOW_MAX_TOKENS,
                },
            }
        ],
        "routes": [{"name": "chat", "models": ["chat"], "backends": [{"provider": "alpha"}]}],
        "tenants": [_tenant("burst", {"tokens": WINDOW_LIMIT, "per": per})],
    }


@dataclass
class Outcome:
    sent: float  # seconds since the run started
    done: float
    status: int  # 0: no HTTP answer
    charged: int  # an admitted request's real usage (total_tokens)
    code: str | None = None


@dataclass
class WindowResult:
    per_s: float
    clients: int
    duration_s: float
    replicas: int
    estimate: int
    outcomes: list[Outcome] = field(default_factory=list)
    hosts_used: dict[str, int] = field(default_factory=dict)  # ext_proc endpoint -> rq_total
    cpu_s: dict[str, float] = field(default_factory=dict)
    # The limiter's own log in Redis, polled during the run: reservation -> (decision time
    # in s on Redis' clock, amount charged now: the real usage once reconciled).
    store_log: dict[str, tuple[float, int]] = field(default_factory=dict)
    # "limiter store down/up" lines from the logs of `up` and the replicas.
    store_lines: list[str] = field(default_factory=list)

    @property
    def bound(self) -> int:
        return WINDOW_LIMIT + self.estimate

    def admitted(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200]

    def fixed_windows(self) -> list[tuple[int, int]]:
        """(tokens, requests) admitted per window [k*per, (k+1)*per) by send time."""
        count = max(1, round(self.duration_s / self.per_s))
        windows = [[0, 0] for _ in range(count)]
        for o in self.admitted():
            index = min(count - 1, int(o.sent // self.per_s))
            windows[index][0] += o.charged
            windows[index][1] += 1
        return [(t, r) for t, r in windows]

    def worst_window(self, length_s: float) -> tuple[int, float]:
        """Most tokens admitted in any interval of length_s by send time, and its start."""
        admitted = sorted((o.sent, o.charged) for o in self.admitted())
        worst, at = 0, 0.0
        end, total = 0, 0
        for start_index, (start, _) in enumerate(admitted):
            while end < len(admitted) and admitted[end][0] < start + length_s:
                total += admitted[end][1]
                end += 1
            if total > worst:
                worst, at = total, start
            total -= admitted[start_index][1]
        return worst, at

    def worst_store_window(self, length_s: float) -> int:
        """Most tokens the store charged within any interval of length_s of decision time."""
        charges = sorted(self.store_log.values())
        worst, end, total = 0, 0, 0
        for start_index, (start, _) in enumerate(charges):
            while end < len(charges) and charges[end][0] < start + length_s:
                total += charges[end][1]
                end += 1
            worst = max(worst, total)
            total -= charges[start_index][1]
        return worst

    def latencies(self, status: int) -> list[float]:
        return [o.done - o.sent for o in self.outcomes if o.status == status]


async def _poll_store_log(
    redis_url: str, log: dict[str, tuple[float, int]], stop: asyncio.Event
) -> None:
    """Read the tenant's token log (a ZSET: member "<amount>:<rid>", score = decision µs)
    every 2 s; every charge stays in it for a whole window, so none is missed."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    try:
        while True:
            keys = [key async for key in client.scan_iter(match="sg:*:l:tenant:burst:tokens:*")]
            for key in keys:
                # With scores: (member, score) pairs (redis-py's stubs cannot tell).
                entries = await client.zrange(key, 0, -1, withscores=True)
                for member, score in cast(list[tuple[bytes, float]], entries):
                    amount, _, rid = member.decode().partition(":")
                    log[rid] = (score / 1e6, int(amount))
            if stop.is_set():
                return
            await sleep_or_stop(stop, 2.0)
    finally:
        await client.aclose()


async def _hammer(
    url: str,
    clients: int,
    seconds: float,
    origin: float,
    redis_url: str,
    store_log: dict[str, tuple[float, int]],
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    deadline = origin + seconds
    headers = _headers("burst")
    stop = asyncio.Event()
    poller = asyncio.create_task(_poll_store_log(redis_url, store_log, stop))
    async with _session(clients) as session:

        async def client() -> None:
            while time.monotonic() < deadline:
                sent = time.monotonic()
                status, charged, code = 0, 0, None
                try:
                    async with session.post(url, data=WINDOW_BODY, headers=headers) as response:
                        raw = await response.read()
                        status = response.status
                    if status == 200:
                        charged = int(json.loads(raw)["usage"]["total_tokens"])
                    else:
                        code = error_code(raw)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    code = type(exc).__name__
                outcomes.append(
                    Outcome(sent - origin, time.monotonic() - origin, status, charged, code)
                )
                if status != 200:
                    await asyncio.sleep(REFUSED_PAUSE_S)

        await asyncio.gather(*(client() for _ in range(clients)))
    await asyncio.sleep(1.0)  # the last reconciles land
    stop.set()
    await poller
    return outcomes


def _ext_proc_hosts(stack: UpStack) -> dict[str, int]:
    clusters = get_json(stack.admin + "/clusters?format=json")["cluster_statuses"]
    ext_proc = next(c for c in clusters if c["name"] == "sluicegate_ext_proc")
    used = {}
    for host in ext_proc["host_statuses"]:
        address = host["address"]["socket_address"]
        stats = {s["name"]: int(s.get("value", 0)) for s in host["stats"]}
        used[f"{address['address']}:{address['port_value']}"] = stats.get("rq_total", 0)
    return used


def run_window(
    work: Path, per_s: float, clients: int, windows: int, replicas: int, redis_url: str
) -> WindowResult:
    per = f"{per_s:g}s"
    stack = start_stacks(
        work, {"window": window_doc(per, redis_url, replicas)}, _key("burst"), "chat"
    )["window"]
    facts = inspect_request(WINDOW_BODY, max_output_tokens=10**6)
    result = WindowResult(
        per_s, clients, per_s * windows, replicas, facts.prompt_tokens + WINDOW_MAX_TOKENS
    )
    try:
        # start_stacks' probe request (a few tokens) is charged before the run starts.
        cpu0 = stack.cpu()
        origin = time.monotonic()
        result.outcomes = asyncio.run(
            _hammer(
                stack.url + "/v1/chat/completions",
                clients,
                result.duration_s,
                origin,
                redis_url,
                result.store_log,
            )
        )
        cpu1 = stack.cpu()
        result.cpu_s = {role: cpu1[role] - cpu0.get(role, 0.0) for role in cpu1}
        result.hosts_used = _ext_proc_hosts(stack)
    finally:
        stack.stop()
        result.store_lines = stack.log_lines("limiter store")
    return result


# ----- part 4: priority under overload -------------------------------------------------------

PRIO_CLASSES: Final = (
    {"name": "interactive", "max_queue": 16, "max_wait": "5s"},
    {"name": "batch", "max_queue": 8, "max_wait": "2s"},
)
PRIO_GATE: Final = {"max_requests": 4, "headroom": 0.25}
PRIO_TTFT_MS: Final = 200
PRIO_TOKENS: Final = 16
PRIO_TENANTS: Final = {"interactive": "ui", "batch": "jobs"}
PRIO_PHASES: Final = ("gated", "open", "fifo")
PRIO_LABELS: Final = {
    "gated": "priority gate: `concurrency: {max_requests: 4, headroom: 0.25}`",
    "open": "no gate: everything goes to the provider at once",
    "fifo": "Envoy's pool limit only: `pool: {max_connections: 4}` (FIFO, no priority)",
}


def priority_doc() -> dict[str, Any]:
    listen, mock = free_ports(2)
    return {
        "version": 1,
        "sluicegate": addresses(),
        "admission": {
            "priority_classes": list(PRIO_CLASSES),
            "default_priority": "batch",
            "lane": "exact",
        },
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "providers": [
            {
                "name": "slow",
                "base_url": f"http://127.0.0.1:{mock}/v1",
                "mock": {
                    "models": [],
                    "ttft_ms": PRIO_TTFT_MS,
                    "itl_ms": 0,
                    "output_tokens": PRIO_TOKENS,
                },
            }
        ],
        "routes": [
            {
                "name": "gated",
                "models": ["gated"],
                "backends": [{"provider": "slow"}],
                "concurrency": dict(PRIO_GATE),
            },
            {"name": "open", "models": ["open"], "backends": [{"provider": "slow"}]},
            # Envoy's own limit, no priority: 4 connections, the rest wait FIFO in the pool.
            {
                "name": "fifo",
                "models": ["fifo"],
                "backends": [{"provider": "slow"}],
                "pool": {"max_connections": 4},
            },
        ],
        "tenants": [
            _tenant(PRIO_TENANTS["interactive"], priority="interactive"),
            _tenant(PRIO_TENANTS["batch"], priority="batch"),
        ],
    }


@dataclass
class PrioOutcome:
    cls: str
    sent: float
    done: float
    status: int
    code: str | None
    retry_after: str | None
    processing_ms: float | None  # the provider's openai-processing-ms


@dataclass
class PrioPhase:
    model: str
    seconds: float
    outcomes: list[PrioOutcome] = field(default_factory=list)
    provider_max_in_flight: int = 0
    provider_requests: int = 0
    # From /metrics: queue time histogram buckets and admission decisions, per class.
    queue_buckets: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    decisions: dict[tuple[str, str], float] = field(default_factory=dict)

    def of(self, cls: str) -> list[PrioOutcome]:
        return [o for o in self.outcomes if o.cls == cls]


@dataclass
class PriorityResult:
    clients: dict[str, int]
    phases: dict[str, PrioPhase] = field(default_factory=dict)


async def _prio_clients(
    url: str, model: str, clients: dict[str, int], seconds: float, origin: float
) -> list[PrioOutcome]:
    outcomes: list[PrioOutcome] = []
    stop = asyncio.Event()
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": PRIO_TOKENS}
    ).encode()
    total = sum(clients.values())
    async with _session(total) as session:

        async def client(cls: str) -> None:
            headers = _headers(PRIO_TENANTS[cls])
            while not stop.is_set():
                sent = time.monotonic()
                status, code, retry_after, processing = 0, None, None, None
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        raw = await response.read()
                        status = response.status
                        retry_after = response.headers.get("retry-after")
                        value = response.headers.get("openai-processing-ms")
                        processing = float(value) if value is not None else None
                    if status != 200:
                        code = error_code(raw)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    code = type(exc).__name__
                outcomes.append(
                    PrioOutcome(
                        cls,
                        sent - origin,
                        time.monotonic() - origin,
                        status,
                        code,
                        retry_after,
                        processing,
                    )
                )
                if status != 200:
                    # As the SDKs do: wait what Retry-After says (1 s without one).
                    wait = float(retry_after) if retry_after and retry_after.isdigit() else 1.0
                    await sleep_or_stop(stop, wait)

        async def timer() -> None:
            await asyncio.sleep(seconds)
            stop.set()

        await asyncio.gather(timer(), *(client(c) for c, n in clients.items() for _ in range(n)))
    return outcomes


def _prio_phase(
    stack: UpStack, mock: str, model: str, clients: dict[str, int], seconds: float
) -> PrioPhase:
    phase = PrioPhase(model, seconds)
    get_json(mock + "/mock/reset", method="POST")
    before = metrics(stack.http + "/metrics")
    origin = time.monotonic()
    phase.outcomes = asyncio.run(
        _prio_clients(stack.url + "/v1/chat/completions", model, clients, seconds, origin)
    )
    after = metrics(stack.http + "/metrics")
    stats = get_json(mock + "/mock/stats")
    phase.provider_max_in_flight = int(stats["max_in_flight"])
    phase.provider_requests = int(stats["requests_total"])
    for cls in clients:
        for outcome in ("admitted", "shed"):
            phase.queue_buckets[(cls, outcome)] = histogram_delta(
                before,
                after,
                "sluicegate_queue_time_seconds",
                {"priority": cls, "outcome": outcome},
            )
    for (name, labels), value in after.items():
        if name == "sluicegate_admission_decisions_total":
            as_dict = dict(labels)
            key = (as_dict.get("priority", ""), as_dict.get("outcome", ""))
            phase.decisions[key] = value - before.get((name, labels), 0.0)
    return phase


def run_priority(work: Path, clients: dict[str, int], seconds: float) -> PriorityResult:
    doc = priority_doc()
    stack = start_stacks(work, {"priority": doc}, _key(PRIO_TENANTS["interactive"]), "gated")[
        "priority"
    ]
    mock = doc["providers"][0]["base_url"].removesuffix("/v1")
    result = PriorityResult(dict(clients))
    try:
        for model in PRIO_PHASES:
            print(f"  priority: {model} route, {seconds:.0f} s ...", flush=True)
            result.phases[model] = _prio_phase(stack, mock, model, clients, seconds)
    finally:
        stack.stop()
    return result


def queue_quantiles(buckets: list[tuple[float, float]]) -> tuple[float | None, ...]:
    return tuple(histogram_quantile(buckets, q) for q in (0.5, 0.95, 0.99))
