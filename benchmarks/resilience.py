"""Benchmark: what clients see when providers fail, and what keep-alive saves.

Not collected by pytest. Run from the repository root (venv active, Envoy on PATH):

    python -m benchmarks.resilience            # full run (~5 min on 2 cores), updates RESULTS.md
    python -m benchmarks.resilience --quick    # shorter, prints only (--write to record)

Options: --concurrency N (part 1, default 8), --json FILE (every figure), --keep-logs,
--skip-quickstart.

Everything runs as real processes on 127.0.0.1: `sluicegate up FILE --no-mocks
--envoy-concurrency 1` (control plane, ext_proc, one Envoy) in front of mock providers
this script starts as their own processes (`sluicegate mock-provider`), so it can kill
them or change their behaviour live (POST /mock/config). Each scenario has its own route,
hence its own Envoy cluster with fresh outlier-detection state; every route uses the
built-in defaults (docs/resilience.md) except `timeouts.first_byte: 1s`, so that an
attempt on a hung provider gives up after 1 s instead of 90 s. Requests are non-streamed
chat completions, 2 output tokens, TTFT 5 ms, through a closed loop of N clients
(aiohttp, one kept-alive connection each).

1. One of two providers failing 100% (routes of providers `a` and `b`, weight 1:1):
   after a warm-up with both healthy, `a` starts failing — connection refused (its
   process SIGKILLed: in-flight requests are reset, new connections refused), 503, 429
   with Retry-After: 1, hang (accepts, never answers; the first-byte timeout fires).
   The hang case runs again with a single client (the defaults, another route). Then
   what-ifs on routes overriding some settings: for 429, `retries` (retry_after_max: 0;
   a budget that never binds at this load; both) and `outlier_detection.eject_on_429:
   false` (Envoy's own behaviour, 429 never ejects); for hang with one client,
   `consecutive_local_origin_failure: 5` (Envoy's split mode). Last, 2 x 40 sequential
   requests on a route with `eject_on_429: false` count where first attempts go while
   `a` answers 429 (x-mock-fault) and is not ejected.
   Measured: client-visible errors over the whole fault window and for the requests
   started after ejection (aim: <= 0.1%), time from fault start until Envoy's
   `outlier_detection.ejections_enforced_total` for the route's cluster is > 0 (admin
   /stats polled every 20 ms), upstream attempts per client request (both mocks'
   `requests_total` deltas; for connection refused `b`'s delta plus Envoy's per-host
   `rq_total` and `cx_connect_fail` for `a`) and Envoy's retries per client request.
2. All providers failing (503 on both; also every attempt hanging at the highest
   concurrency): upstream attempts per client request, retries refused by the budget
   (`upstream_rq_retry_overflow`), client error rate and how fast the failure comes back.
   Envoy's retry budget caps retries *in flight* at max(percent x (active + pending
   requests), min_concurrency); it does not cap their count. The count ratio is checked
   against 1 + percent once more clients than min_concurrency are in flight, and against
   1 + max_retries below that (where the budget allows every retry).
3. Keep-alive effect, against a TLS mock provider (a test CA and server certificate made
   with the openssl CLI; the provider's `tls.ca_file` is the CA): sequential requests
   through Envoy with pooled connections vs `pool.max_requests_per_connection: 1` (a new
   TCP + TLS connection per request), and, as the same-session baseline, directly to the
   mock over one kept-alive TLS connection. Rounds rotate the order of the three paths.
4. The quickstart's Envoy (`sluicegate up examples/quickstart.yaml`, admin on
   127.0.0.1:9901) must show the settings in /config_dump: circuit breakers with the retry
   budget, outlier detection with every enforcing_* written, retry policy with
   previous_hosts and rate_limited_retry_back_off, timeouts; and the outlier settings
   must be what the quickstart's `outlier_detection` implies (split mode off while
   consecutive_local_origin_failure is null; with eject_on_429, an error_matcher for 429
   and 5xx in the cluster's HttpProtocolOptions). Skipped, with a message, when the
   quickstart's ports are taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.harness.answers import error_code
from benchmarks.harness.cli import benchmark_parser, command_line
from benchmarks.harness.results import machine, today, update_section
from benchmarks.harness.stack import MockProvider, Ports, UpStack
from benchmarks.harness.stats import percentile
from sluicegate.config import OutlierDetection, Retries, load_config
from sluicegate.config.resilience import effective, merge
from sluicegate.provider import make_test_ca as make_provider_test_ca
from sluicegate.testing import running_children
from sluicegate.xds.resource import HTTP_PROTOCOL_OPTIONS

SECTION = "Provider failures"
ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
CLIENT_KEY = "sk-sluicegate-bench"
SERVER_NAME = "mock.sluicegate.test"
FIRST_BYTE = "1s"
#: Per request: small, fast answers (the mock's defaults are overridden per request).
MOCK_HEADERS = {"x-mock-output-tokens": "2", "x-mock-ttft-ms": "5", "x-mock-itl-ms": "1"}
#: Part 3 measures overhead: the mock answers at once.
KEEPALIVE_HEADERS = {"x-mock-output-tokens": "1", "x-mock-ttft-ms": "0", "x-mock-itl-ms": "0"}
AIM_ERROR_RATE = 0.001
EJECTION_POLL_S = 0.02
START_TIMEOUT_S = 90.0
REQUEST_TIMEOUT_S = 30.0
QUICKSTART_PORTS = (10000, 9901, 18000, 18001, 9100, 18081, 18082)
QUICKSTART_ADMIN = "http://127.0.0.1:9901"
QUICKSTART_PORT_WAIT_S = 30.0
FAULTS = ("refused", "503", "429", "hang")
FAULT_LABELS = {
    "refused": "connection refused (process killed)",
    "503": "503",
    "429": "429, Retry-After: 1",
    "hang": "hang (first_byte 1 s fires)",
}


@dataclass(frozen=True)
class WhatIf:
    """Part 1 again on a route that overrides some defaults: evidence for a proposal."""

    key: str
    fault: str
    overrides: Mapping[str, Mapping[str, Any]]  # route sections: retries, outlier_detection
    label: str
    single: bool = False  # one client (Plan.single) instead of the plan's concurrency

    def retries(self) -> Retries:
        """The route's retries: the defaults with these overrides (as the gateway merges)."""
        return merge(Retries(), Retries.model_validate(self.overrides.get("retries", {})))

    def outlier(self) -> OutlierDetection:
        changes = self.overrides.get("outlier_detection", {})
        return merge(OutlierDetection(), OutlierDetection.model_validate(changes))


#: The hang scenario with the defaults, one client: not a change of settings, a new route.
SEQUENTIAL_HANG = WhatIf("hang-1-client", "hang", {}, "", single=True)
#: Sequential requests on this route count where first attempts go while `a` answers 429
#: and is not ejected; no Retry-After wait, so that 2 x 40 requests take little time.
FIRST_PICKS = WhatIf(
    "first-picks",
    "429",
    {"retries": {"retry_after_max": 0}, "outlier_detection": {"eject_on_429": False}},
    "",
)


def what_ifs(clients: int) -> tuple[WhatIf, ...]:
    """A provider answering 429 is ejected once consecutive_5xx of its answers in a row
    were 429 (eject_on_429); until then every request whose first attempt goes to it needs
    a retry. What limits the errors of that transient, the Retry-After wait
    (retry_after_max) or the retry budget? `min_concurrency: clients` lets every request
    have a retry in flight, i.e. switches the budget off at this load. `eject_on_429:
    false` shows what the ejection saves (Envoy alone ignores 429). And a hung provider
    with one client in split mode (consecutive_local_origin_failure set): why that mode
    is not the default."""
    open_budget = {"budget": {"min_concurrency": clients}}
    return (
        WhatIf("429-no-wait", "429", {"retries": {"retry_after_max": 0}},
               "`retry_after_max: 0` (retry after the back-off, not Retry-After)"),
        WhatIf("429-open-budget", "429", {"retries": open_budget},
               f"`budget.min_concurrency: {clients}` (the budget never binds)"),
        WhatIf("429-both", "429", {"retries": {"retry_after_max": 0, **open_budget}},
               f"both: `retry_after_max: 0`, `budget.min_concurrency: {clients}`"),
        WhatIf("429-no-eject", "429", {"outlier_detection": {"eject_on_429": False}},
               "`eject_on_429: false` (Envoy's own behaviour: 429 never ejects)"),
        WhatIf("hang-split", "hang", {"outlier_detection": {"consecutive_local_origin_failure": 5}},
               "`consecutive_local_origin_failure: 5` (split mode)", single=True),
    )  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """Durations and sizes of one run (full or --quick)."""

    concurrency: int
    warm_s: float
    fault_s: float
    storm_levels: tuple[int, ...]
    storm_s: float
    hang_storm: bool
    ka_rounds: int
    ka_requests: int
    sequential_s: float  # the hang scenario again with one client

    @classmethod
    def make(cls, quick: bool, concurrency: int) -> Plan:
        if quick:
            return cls(concurrency, 2.0, 8.0, (2, 8, 32), 4.0, False, 3, 60, 6.0)
        return cls(concurrency, 3.0, 20.0, (2, 8, 32), 8.0, True, 6, 150, 10.0)

    def single(self) -> Plan:
        """The same plan with one client and the sequential window."""
        return dataclasses.replace(self, concurrency=1, fault_s=self.sequential_s)


# ----- processes ---------------------------------------------------------------------------


def start_mock(
    name: str, port: int, work: Path, tls: tuple[Path, Path] | None = None
) -> MockProvider:
    """`sluicegate mock-provider` in its own process (so it can be killed): small, fast
    answers, Retry-After: 1 on a 429; TLS with (certificate, key)."""
    args = ["--name", name, "--ttft-ms", "5", "--itl-ms", "1", "--output-tokens", "2",
            "--retry-after-s", "1"]  # fmt: skip
    if tls is not None:
        args += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    return MockProvider(name, port, work, args, tls=tls is not None)


def start_gateway(work: Path, doc: Mapping[str, Any]) -> UpStack:
    """`sluicegate up FILE --no-mocks` on free ports: the mocks are this script's."""
    return UpStack(work, doc, extra=["--no-mocks"])


def wait_serving(gw: UpStack, model: str) -> None:
    gw.wait_serving(model, request_headers(MOCK_HEADERS), START_TIMEOUT_S, max_tokens=None)


def request_headers(extra: Mapping[str, str]) -> dict[str, str]:
    return {"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}", **extra}


def make_test_ca(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for SERVER_NAME."""
    certs = make_provider_test_ca(directory, [SERVER_NAME])
    return certs.ca, certs.cert, certs.key


# ----- the configuration under test -----------------------------------------------------------


def storm_route(kind: str, clients: int) -> str:
    return f"all-{kind}-c{clients}"


def gateway_doc(ports: Ports, ca: Path, plan: Plan) -> dict[str, Any]:
    """Routes of providers a and b (1:1) per scenario, and two routes to the TLS mock."""

    def pair(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "models": [name],
            "backends": [{"provider": "a", "weight": 1}, {"provider": "b", "weight": 1}],
        }

    routes = [pair(f"one-{kind}") for kind in FAULTS]
    routes += [
        {**pair(f"one-{w.key}"), **{k: dict(v) for k, v in w.overrides.items()}}
        for w in (SEQUENTIAL_HANG, *what_ifs(plan.concurrency), FIRST_PICKS)
    ]
    routes += [pair(storm_route("503", c)) for c in plan.storm_levels]
    if plan.hang_storm:
        routes.append(pair(storm_route("hang", max(plan.storm_levels))))
    routes += [
        {"name": "ka-pooled", "models": ["ka-pooled"], "backends": [{"provider": "tls"}]},
        {
            "name": "ka-fresh",
            "models": ["ka-fresh"],
            "backends": [{"provider": "tls"}],
            "pool": {"max_requests_per_connection": 1},
        },
    ]
    return {
        "version": 1,
        "admission": {"lane": "exact"},  # the routing stage (the default is lane_rules.py's)
        "sluicegate": ports.sluicegate(),
        # Every built-in default, except that a hung attempt gives up after 1 s, not 90 s.
        "defaults": {"timeouts": {"first_byte": FIRST_BYTE, "first_token": FIRST_BYTE}},
        "listeners": [{"name": "gateway", "address": "127.0.0.1", "port": ports.listener}],
        "providers": [
            # Plain mock processes, not `mock:` providers: their x-mock-* knobs must pass.
            {
                "name": "a",
                "base_url": f"http://127.0.0.1:{ports.providers['a']}/v1",
                "forward_headers": ["x-mock-*"],
            },
            {
                "name": "b",
                "base_url": f"http://127.0.0.1:{ports.providers['b']}/v1",
                "forward_headers": ["x-mock-*"],
            },
            # The IP literal is where to connect; SNI and the checked name come from tls.sni.
            {
                "name": "tls",
                "base_url": f"https://127.0.0.1:{ports.providers['tls']}/v1",
                "tls": {"sni": SERVER_NAME, "ca_file": str(ca)},
                "forward_headers": ["x-mock-*"],
            },
        ],
        "routes": routes,
    }


# ----- HTTP helpers ----------------------------------------------------------------------------


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
        response.raise_for_status()
        return await response.json(content_type=None)


async def mock_config(
    session: aiohttp.ClientSession, mock: MockProvider, changes: Mapping[str, Any]
) -> None:
    async with session.post(
        f"http://127.0.0.1:{mock.port}/mock/config",
        json=dict(changes),
        timeout=aiohttp.ClientTimeout(total=10),
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"/mock/config on {mock.name}: {await response.text()}")


async def mock_requests(session: aiohttp.ClientSession, mock: MockProvider) -> int:
    stats = await get_json(session, f"http://127.0.0.1:{mock.port}/mock/stats")
    return int(stats["requests_total"])


async def cluster_stats(session: aiohttp.ClientSession, admin: str, cluster: str) -> dict[str, int]:
    """Envoy's counters and gauges of one cluster, names without `cluster.<name>.`."""
    prefix = f"cluster.{cluster}."
    pattern = "^" + prefix.replace(".", "[.]")
    document = await get_json(session, f"{admin}/stats?format=json&filter={pattern}")
    return {
        stat["name"].removeprefix(prefix): int(stat["value"])
        for stat in document.get("stats", [])
        if isinstance(stat.get("value"), int)
    }


async def host_stats(
    session: aiohttp.ClientSession, admin: str, cluster: str
) -> dict[int, dict[str, int]]:
    """Per host (by port) counters of one cluster, from /clusters."""
    document = await get_json(session, f"{admin}/clusters?format=json")
    found: dict[int, dict[str, int]] = {}
    for status in document.get("cluster_statuses", []):
        if status.get("name") != cluster:
            continue
        for host in status.get("host_statuses", []):
            port = int(host["address"]["socket_address"]["port_value"])
            found[port] = {s["name"]: int(s.get("value", 0)) for s in host.get("stats", [])}
    return found


async def ejections(session: aiohttp.ClientSession, admin: str, cluster: str) -> int:
    name = f"cluster.{cluster}.outlier_detection.ejections_enforced_total"
    pattern = "^" + name.replace(".", "[.]") + "$"
    async with session.get(
        f"{admin}/stats?filter={pattern}", timeout=aiohttp.ClientTimeout(total=5)
    ) as response:
        text = await response.text()
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


# ----- closed-loop load ------------------------------------------------------------------------


@dataclass
class Rec:
    start: float
    end: float
    status: int  # 0: no HTTP answer (connection error, client timeout)
    provider: str | None
    code: str | None  # the error JSON's code (or type), for non-200 answers


async def closed_loop(
    url: str, model: str, clients: int, stop: asyncio.Event, headers: Mapping[str, str]
) -> list[Rec]:
    """`clients` workers, each sending the next request when the last one is answered,
    until `stop` is set; one kept-alive connection per worker."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    sent = request_headers(headers)
    records: list[Rec] = []
    connector = aiohttp.TCPConnector(limit=clients, limit_per_host=clients)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while not stop.is_set():
                start = time.monotonic()
                status, provider, code = 0, None, None
                try:
                    async with session.post(url, data=body, headers=sent) as response:
                        raw = await response.read()
                        status = response.status
                        provider = response.headers.get("x-mock-provider")
                        if status != 200:
                            code = error_code(raw)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    code = type(exc).__name__
                records.append(Rec(start, time.monotonic(), status, provider, code))

        await asyncio.gather(*(worker() for _ in range(clients)))
    return records


# ----- part 1: one of two providers failing ---------------------------------------------------


@dataclass
class OneFailing:
    fault: str
    variant: str  # "" for the defaults, else WhatIf.label
    retry_after_wait: bool  # does the route wait a 429's Retry-After before retrying?
    min_concurrency: int  # the route's retry budget floor
    eject_on_429: bool
    consecutive_5xx: int
    consecutive_gateway_failure: int
    local_origin_threshold: int | None  # consecutive_local_origin_failure: split mode if set
    clients: int
    warm_s: float
    window_s: float
    requests: int  # client requests that ended after the fault started
    errors: int
    codes: dict[str, int]
    ejected_after_s: float | None
    after_requests: int  # started after the ejection was seen
    after_errors: int
    attempts: int  # upstream attempts in the window
    attempts_from: str
    retries: int  # Envoy's upstream_rq_retry delta
    retry_overflow: int
    ejected_by: dict[str, int]
    p50_ms: float
    p99_ms: float
    max_ms: float
    a_share_before: float  # share of 200s served by `a` during the warm-up
    a_attempts_after_ejection: int | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else float("nan")

    @property
    def after_rate(self) -> float | None:
        return self.after_errors / self.after_requests if self.after_requests else None


async def one_failing(
    gw: UpStack,
    mocks: dict[str, MockProvider],
    fault: str,
    plan: Plan,
    what_if: WhatIf | None = None,
) -> OneFailing:
    route = f"one-{fault if what_if is None else what_if.key}"
    variant = "" if what_if is None else what_if.label
    retry_settings = Retries() if what_if is None else what_if.retries()
    outlier = OutlierDetection() if what_if is None else what_if.outlier()
    cluster = f"route-{route}"
    a, b = mocks["a"], mocks["b"]
    async with aiohttp.ClientSession() as admin:
        stop = asyncio.Event()
        load = asyncio.create_task(
            closed_loop(
                gw.url + "/v1/chat/completions", route, plan.concurrency, stop, MOCK_HEADERS
            )
        )
        await asyncio.sleep(plan.warm_s)
        envoy0 = await cluster_stats(admin, gw.admin, cluster)
        hosts0 = await host_stats(admin, gw.admin, cluster)
        counts0 = {
            name: await mock_requests(admin, m) for name, m in mocks.items() if name != "tls"
        }
        started = time.monotonic()
        if fault == "refused":
            a.kill()
        elif fault == "503":
            await mock_config(admin, a, {"rate_503": 1.0})
        elif fault == "429":
            await mock_config(admin, a, {"rate_429": 1.0, "retry_after_s": 1})
        else:
            await mock_config(admin, a, {"rate_hang": 1.0})
        ejected_at: float | None = None
        a_at_ejection: int | None = None
        end = started + plan.fault_s
        while time.monotonic() < end:
            if ejected_at is None and await ejections(admin, gw.admin, cluster) > 0:
                ejected_at = time.monotonic()
                if not a.killed:
                    a_at_ejection = await mock_requests(admin, a)
            await asyncio.sleep(EJECTION_POLL_S)
        stop.set()
        records = await load
        await asyncio.sleep(0.2)  # let the last attempts be counted
        envoy1 = await cluster_stats(admin, gw.admin, cluster)
        hosts1 = await host_stats(admin, gw.admin, cluster)
        b_delta = await mock_requests(admin, b) - counts0["b"]
        a_after: int | None = None
        if a.killed:
            h0, h1 = hosts0.get(a.port, {}), hosts1.get(a.port, {})
            a_delta = sum(h1.get(k, 0) - h0.get(k, 0) for k in ("rq_total", "cx_connect_fail"))
            source = "b's requests_total + Envoy's rq_total and cx_connect_fail for a"
        else:
            a_now = await mock_requests(admin, a)
            a_delta = a_now - counts0["a"]
            if a_at_ejection is not None:
                a_after = a_now - a_at_ejection
            source = "both mocks' requests_total"
            await mock_config(admin, a, {"rate_503": 0.0, "rate_429": 0.0, "rate_hang": 0.0})
    warm = [r for r in records if r.end < started and r.status == 200]
    window = [r for r in records if r.end >= started]
    errors = [r for r in window if r.status != 200]
    after = [r for r in window if ejected_at is not None and r.start >= ejected_at]
    latencies = [(r.end - r.start) * 1000 for r in window]
    return OneFailing(
        fault=fault,
        variant=variant,
        retry_after_wait=retry_settings.retry_after_max > 0,
        min_concurrency=retry_settings.budget.min_concurrency,
        eject_on_429=outlier.eject_on_429,
        consecutive_5xx=outlier.consecutive_5xx,
        consecutive_gateway_failure=outlier.consecutive_gateway_failure,
        local_origin_threshold=outlier.consecutive_local_origin_failure,
        clients=plan.concurrency,
        warm_s=plan.warm_s,
        window_s=plan.fault_s,
        requests=len(window),
        errors=len(errors),
        codes=dict(Counter(f"{r.status} {r.code}" for r in errors)),
        ejected_after_s=None if ejected_at is None else ejected_at - started,
        after_requests=len(after),
        after_errors=sum(1 for r in after if r.status != 200),
        attempts=a_delta + b_delta,
        attempts_from=source,
        retries=_delta(envoy0, envoy1, "upstream_rq_retry"),
        retry_overflow=_delta(envoy0, envoy1, "upstream_rq_retry_overflow"),
        ejected_by={
            kind: n
            for kind in (
                "consecutive_5xx",
                "consecutive_gateway_failure",
                "consecutive_local_origin_failure",
            )
            if (n := _delta(envoy0, envoy1, f"outlier_detection.ejections_enforced_{kind}"))
        },
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        max_ms=max(latencies, default=float("nan")),
        a_share_before=sum(1 for r in warm if r.provider == "a") / len(warm) if warm else 0.0,
        a_attempts_after_ejection=a_after,
    )


def _delta(before: Mapping[str, int], after: Mapping[str, int], name: str) -> int:
    return after.get(name, 0) - before.get(name, 0)


@dataclass
class FirstPicks:
    """Sequential requests on a 1:1 route. `a`'s requests_total delta counts first
    attempts only: a retry after `a` failed goes to `b` (previous_hosts), and `b` answers."""

    requests: int
    a_healthy: int  # `a`'s requests while both answer
    a_failing: int  # `a`'s requests while it answers 429 (x-mock-fault)
    ejections: int  # the route's ejections_enforced_total delta over both phases
    settings: str  # the route's overrides, for the reading


async def first_picks(gw: UpStack, mocks: dict[str, MockProvider], what_if: WhatIf,
                      requests: int) -> FirstPicks:  # fmt: skip
    """Where do first attempts go when one provider fails but is not ejected?"""
    route = f"one-{what_if.key}"
    body = json.dumps({"model": route, "messages": [{"role": "user", "content": "hi"}]}).encode()
    counts: list[int] = []
    async with (
        aiohttp.ClientSession() as admin,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as client,
    ):
        ejected0 = await ejections(admin, gw.admin, f"route-{route}")
        for fault in ({}, {"x-mock-fault": "429", "x-mock-fault-provider": "a"}):
            before = await mock_requests(admin, mocks["a"])
            headers = request_headers({**MOCK_HEADERS, **fault})
            for _ in range(requests):
                async with client.post(gw.url + "/v1/chat/completions", data=body,
                                       headers=headers) as response:  # fmt: skip
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"first picks: HTTP {response.status}")
            counts.append(await mock_requests(admin, mocks["a"]) - before)
        ejected = await ejections(admin, gw.admin, f"route-{route}") - ejected0
    settings = ", ".join(
        f"`{key}: {json.dumps(value)}`"
        for section in what_if.overrides.values()
        for key, value in section.items()
    )
    return FirstPicks(requests, counts[0], counts[1], ejected, settings)


# ----- part 2: all providers failing -----------------------------------------------------------


@dataclass
class Storm:
    fault: str
    clients: int
    window_s: float
    requests: int
    errors: int
    codes: dict[str, int]
    attempts: int
    retries: int
    retry_overflow: int
    ejections: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    budget_percent: float
    min_concurrency: int
    max_retries: int

    @property
    def per_request(self) -> float:
        return self.attempts / self.requests if self.requests else float("nan")

    @property
    def in_flight_cap(self) -> float:
        """Envoy's cap on retries in flight, taking the clients as the requests in flight."""
        return max(self.budget_percent / 100 * self.clients, float(self.min_concurrency))

    @property
    def bound(self) -> float:
        """The count bound: 1 + percent once more requests are in flight than
        min_concurrency; below that the budget allows every retry (1 + max_retries)."""
        if self.clients > self.min_concurrency:
            return 1 + self.budget_percent / 100
        return 1.0 + self.max_retries


async def all_failing(
    gw: UpStack, mocks: dict[str, MockProvider], fault: str, clients: int, window_s: float
) -> Storm:
    route = storm_route(fault, clients)
    cluster = f"route-{route}"
    pair = [mocks["a"], mocks["b"]]
    change = {"rate_503": 1.0} if fault == "503" else {"rate_hang": 1.0}
    async with aiohttp.ClientSession() as admin:
        for mock in pair:
            await mock_config(admin, mock, change)
        envoy0 = await cluster_stats(admin, gw.admin, cluster)
        counts0 = [await mock_requests(admin, m) for m in pair]
        stop = asyncio.Event()
        load = asyncio.create_task(
            closed_loop(gw.url + "/v1/chat/completions", route, clients, stop, MOCK_HEADERS)
        )
        await asyncio.sleep(window_s)
        stop.set()
        records = await load
        await asyncio.sleep(0.2)
        envoy1 = await cluster_stats(admin, gw.admin, cluster)
        attempts = sum([await mock_requests(admin, m) for m in pair]) - sum(counts0)
        for mock in pair:
            await mock_config(admin, mock, {"rate_503": 0.0, "rate_hang": 0.0})
    failed = [r for r in records if r.status != 200]
    latencies = [(r.end - r.start) * 1000 for r in failed]
    defaults = Retries()
    return Storm(
        fault=fault,
        clients=clients,
        window_s=window_s,
        requests=len(records),
        errors=len(failed),
        codes=dict(Counter(f"{r.status} {r.code}" for r in failed)),
        attempts=attempts,
        retries=_delta(envoy0, envoy1, "upstream_rq_retry"),
        retry_overflow=_delta(envoy0, envoy1, "upstream_rq_retry_overflow"),
        ejections=_delta(envoy0, envoy1, "outlier_detection.ejections_enforced_total"),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        max_ms=max(latencies, default=float("nan")),
        budget_percent=defaults.budget.percent,
        min_concurrency=defaults.budget.min_concurrency,
        max_retries=defaults.max_retries,
    )


# ----- part 3: keep-alive effect -----------------------------------------------------------------


@dataclass
class KeepAlive:
    rounds: int
    per_round: int
    samples_ms: dict[str, list[float]]
    new_connections: dict[str, int]  # at the mock, per path, over all rounds
    envoy_cx: dict[str, int]  # Envoy's upstream_cx_total delta per route

    def p(self, path: str, q: float) -> float:
        return percentile(self.samples_ms[path], q)


KA_PATHS = ("direct", "pooled", "fresh")


async def keep_alive(gw: UpStack, tls_mock: MockProvider, ca: Path, plan: Plan) -> KeepAlive:
    body = json.dumps({"model": "ka", "messages": [{"role": "user", "content": "hi"}]}).encode()
    context = ssl.create_default_context(cafile=str(ca))
    samples: dict[str, list[float]] = {path: [] for path in KA_PATHS}
    connections: dict[str, int] = dict.fromkeys(KA_PATHS, 0)
    envoy_cx: dict[str, int] = dict.fromkeys(("pooled", "fresh"), 0)

    async def mock_connections(session: aiohttp.ClientSession) -> int:
        async with session.get(f"{tls_mock.base}/mock/stats", ssl=context,
                               server_hostname=SERVER_NAME) as response:  # fmt: skip
            stats = await response.json()
            return int(stats["connections_total"])

    def target(path: str) -> tuple[str, bytes, dict[str, str], dict[str, Any]]:
        if path == "direct":
            return (
                f"{tls_mock.base}/v1/chat/completions",
                body,
                request_headers(KEEPALIVE_HEADERS),
                {"ssl": context, "server_hostname": SERVER_NAME},
            )
        model = f"ka-{path}"
        data = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        return (
            gw.url + "/v1/chat/completions",
            data.encode(),
            request_headers(KEEPALIVE_HEADERS),
            {},
        )

    async with (
        aiohttp.ClientSession() as admin,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as direct,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as via_envoy,
    ):

        async def one(path: str) -> float:
            url, data, headers, extra = target(path)
            session = direct if path == "direct" else via_envoy
            started = time.perf_counter()
            async with session.post(url, data=data, headers=headers, **extra) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{path}: HTTP {response.status}")
            return (time.perf_counter() - started) * 1000

        for path in KA_PATHS:  # warm-up: connections made, code paths hot
            for _ in range(20):
                await one(path)
        for round_ in range(plan.ka_rounds):
            order = KA_PATHS[round_ % 3 :] + KA_PATHS[: round_ % 3]
            for path in order:
                conns0 = await mock_connections(admin)
                cx0 = (
                    await cluster_stats(admin, gw.admin, f"route-ka-{path}")
                    if path != "direct"
                    else {}
                )
                for _ in range(plan.ka_requests):
                    samples[path].append(await one(path))
                connections[path] += await mock_connections(admin) - conns0
                if path != "direct":
                    cx1 = await cluster_stats(admin, gw.admin, f"route-ka-{path}")
                    envoy_cx[path] += _delta(cx0, cx1, "upstream_cx_total")
    return KeepAlive(plan.ka_rounds, plan.ka_requests, samples, connections, envoy_cx)


# ----- part 4: the quickstart's config_dump ------------------------------------------------------


@dataclass
class QuickstartCheck:
    skipped: str | None = None
    rows: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # setting -> per route
    missing: list[str] = field(default_factory=list)
    # Outlier settings whose value is not what the quickstart's `outlier_detection` implies:
    # "route: label: found X, expected Y".
    wrong: list[str] = field(default_factory=list)
    routes: list[str] = field(default_factory=list)
    keys_in_dump: bool = False


def ports_busy(ports: Sequence[int]) -> list[int]:
    busy = []
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


def quickstart_check(work: Path) -> QuickstartCheck:
    busy = ports_busy(QUICKSTART_PORTS)
    deadline = time.monotonic() + QUICKSTART_PORT_WAIT_S
    while busy and time.monotonic() < deadline:  # e.g. a test run on the machine finishing
        time.sleep(1.0)
        busy = ports_busy(QUICKSTART_PORTS)
    if busy:
        return QuickstartCheck(
            skipped=f"quickstart ports in use for {QUICKSTART_PORT_WAIT_S:.0f} s: {busy}"
        )
    doc = yaml.safe_load(QUICKSTART.read_text())
    route_names = [r["name"] for r in doc["routes"]]
    stack = UpStack(
        work, config=QUICKSTART, log_name="quickstart-up.log", run_dir=work / "quickstart-run"
    )
    try:
        dump = _wait_dump(stack.process, stack.log_path, route_names)
        with urllib.request.urlopen(
            f"{QUICKSTART_ADMIN}/config_dump?include_eds", timeout=10
        ) as response:
            full_text = response.read().decode()
    finally:
        left = stack.stop()
        if left:
            print(f"quickstart: had to SIGKILL {left}")
    keys = [p.read_text().strip() for p in (QUICKSTART.parent / "keys").glob("*.key")]
    check = summarize_dump(dump, route_names, expected_outlier(QUICKSTART))
    check.keys_in_dump = any(key and key in full_text for key in keys)
    return check


def _wait_dump(
    process: subprocess.Popen[bytes], log_path: Path, route_names: Sequence[str]
) -> dict[str, Any]:
    deadline = time.monotonic() + START_TIMEOUT_S
    wanted = {f"route-{name}" for name in route_names}
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"quickstart `up` exited:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{QUICKSTART_ADMIN}/config_dump", timeout=5) as response:
                dump: dict[str, Any] = json.load(response)
            clusters, routes = _dump_parts(dump)
            if wanted <= set(clusters) and set(route_names) <= set(routes):
                return dump
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"quickstart config never complete:\n{log_path.read_text()[-3000:]}")


def _dump_parts(dump: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    clusters: dict[str, Any] = {}
    routes: dict[str, Any] = {}
    for config in dump.get("configs", []):
        for item in config.get("dynamic_active_clusters", []):
            clusters[item["cluster"]["name"]] = item["cluster"]
        for item in config.get("dynamic_route_configs", []):
            for host in item["route_config"].get("virtual_hosts", []):
                for route in host.get("routes", []):
                    routes.setdefault(route.get("name", ""), route)
    return clusters, routes


def _dig(value: Any, *path: str | int) -> Any:
    for step in path:
        if isinstance(step, int):
            value = value[step] if isinstance(value, list) and len(value) > step else None
        else:
            value = value.get(step) if isinstance(value, dict) else None
        if value is None:
            return None
    return value


def _show(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, dict | list | bool):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


OUTLIER_COUNTS = "outlier consecutive 5xx / gateway / local-origin"
OUTLIER_ENFORCING = "enforcing_consecutive_5xx / gateway / local-origin"
OUTLIER_SPLIT = "split_external_local_origin_errors"
OUTLIER_MATCHER = "HttpProtocolOptions outlier error_matcher (`:status`)"


def expected_outlier(config_path: Path) -> dict[str, dict[str, str]]:
    """Per outlier row, per route: the value the config's effective `outlier_detection`
    implies in the config_dump, rendered as summarize_dump renders it (— = absent). Split
    mode only when consecutive_local_origin_failure is set (a count of 0 is not written);
    with eject_on_429, an error matcher for 429 and every 5xx."""
    config = load_config(config_path)
    expected: dict[str, dict[str, str]] = {
        label: {} for label in (OUTLIER_COUNTS, OUTLIER_ENFORCING, OUTLIER_SPLIT, OUTLIER_MATCHER)
    }
    for route in config.routes:
        od = effective(config.defaults, route).outlier_detection
        if not od.enabled:
            continue
        split = od.consecutive_local_origin_failure is not None
        local = od.consecutive_local_origin_failure if split else None
        counts = (od.consecutive_5xx, od.consecutive_gateway_failure, local)
        expected[OUTLIER_COUNTS][route.name] = " / ".join(str(n) if n else "—" for n in counts)
        expected[OUTLIER_ENFORCING][route.name] = " / ".join("100" if n else "0" for n in counts)
        expected[OUTLIER_SPLIT][route.name] = _show(split)
        expected[OUTLIER_MATCHER][route.name] = "429 or 500-599" if od.eject_on_429 else "—"
    return expected


def summarize_dump(
    dump: Mapping[str, Any],
    route_names: Sequence[str],
    expected: Mapping[str, Mapping[str, str]] | None = None,
) -> QuickstartCheck:
    """One row per setting, one column per quickstart route; `missing` lists required
    settings absent from a route's cluster or route entry, `wrong` the values that differ
    from `expected` (label -> route -> rendered value)."""
    clusters, routes = _dump_parts(dump)
    check = QuickstartCheck(routes=list(route_names))
    protocol = HTTP_PROTOCOL_OPTIONS
    # (label, where, path, required)
    items: list[tuple[str, str, tuple[str | int, ...], bool]] = [
        ("connect_timeout", "cluster", ("connect_timeout",), True),
        ("circuit breakers max_connections / pending / requests", "cluster", ("@limits",), True),
        ("retry_budget", "cluster", ("circuit_breakers", "thresholds", 0, "retry_budget"), True),
        (
            "idle_timeout (pool)",
            "cluster",
            (
                "typed_extension_protocol_options",
                protocol,
                "common_http_protocol_options",
                "idle_timeout",
            ),
            True,
        ),
        (OUTLIER_COUNTS, "cluster", ("@consecutive",), True),
        (OUTLIER_ENFORCING, "cluster", ("@enforcing",), True),
        ("enforcing_success_rate / local-origin", "cluster", ("@sr",), True),
        ("enforcing_failure_percentage / local-origin", "cluster", ("@fp",), True),
        (OUTLIER_SPLIT, "cluster", ("@split",), True),
        (OUTLIER_MATCHER, "cluster", ("@matcher",), False),
        ("interval / base / max ejection time", "cluster", ("@ejection",), True),
        ("max_ejection_percent", "cluster", ("outlier_detection", "max_ejection_percent"), True),
        ("health checks (path, interval)", "cluster", ("@health",), False),
        ("route timeout (total)", "route", ("route", "timeout"), True),
        ("retry_on", "route", ("route", "retry_policy", "retry_on"), True),
        (
            "retriable_status_codes",
            "route",
            ("route", "retry_policy", "retriable_status_codes"),
            True,
        ),
        ("num_retries", "route", ("route", "retry_policy", "num_retries"), True),
        (
            "per_try_timeout (first_byte)",
            "route",
            ("route", "retry_policy", "per_try_timeout"),
            True,
        ),
        (
            "per_try_idle_timeout (idle)",
            "route",
            ("route", "retry_policy", "per_try_idle_timeout"),
            True,
        ),
        ("retry_back_off", "route", ("route", "retry_policy", "retry_back_off"), True),
        ("rate_limited_retry_back_off", "route", ("@ratelimited",), True),
        ("retry_host_predicate", "route", ("@predicate",), True),
        (
            "host_selection_retry_max_attempts",
            "route",
            ("route", "retry_policy", "host_selection_retry_max_attempts"),
            True,
        ),
        ("retry_priority", "route", ("@priority",), False),
    ]
    for label, where, path, required in items:
        values: dict[str, str] = {}
        for name in route_names:
            source = clusters.get(f"route-{name}") if where == "cluster" else routes.get(name)
            value = (
                _special(source, path[0]) if str(path[0]).startswith("@") else _dig(source, *path)
            )
            if required and value is None:
                if label in _MULTI_PROVIDER_ONLY and _single_provider(name):
                    values[name] = "— (one provider)"
                    continue
                check.missing.append(f"{name}: {label}")
            values[name] = _show(value)
            want = (expected or {}).get(label, {}).get(name)
            if want is not None and values[name] != want:
                check.wrong.append(f"{name}: {label} is {values[name]}, expected {want}")
        check.rows.append((label, values))
    return check


_MULTI_PROVIDER_ONLY = ("retry_host_predicate", "host_selection_retry_max_attempts")


def _single_provider(route: str) -> bool:
    doc = yaml.safe_load(QUICKSTART.read_text())
    for item in doc["routes"]:
        if item["name"] == route:
            return len(item["backends"]) == 1
    return False


def _special(source: Any, key: str | int) -> Any:
    outlier = _dig(source, "outlier_detection")
    if key == "@limits":
        limits = _dig(source, "circuit_breakers", "thresholds", 0)
        if limits is None:
            return None
        return " / ".join(
            str(limits.get(k, "—"))
            for k in ("max_connections", "max_pending_requests", "max_requests")
        )
    if key == "@split":
        if outlier is None:
            return None
        # proto3 JSON leaves out a false bool: absent means false.
        return bool(outlier.get("split_external_local_origin_errors", False))
    if key == "@matcher":
        matcher = _dig(source, "typed_extension_protocol_options", HTTP_PROTOCOL_OPTIONS,
                       "outlier_detection", "error_matcher")  # fmt: skip
        return None if matcher is None else " or ".join(_statuses(matcher))
    if key == "@consecutive":
        # A count is written only when its detector is on; local-origin only in split mode.
        if outlier is None:
            return None
        counts = [outlier.get(n) for n in ("consecutive_5xx", "consecutive_gateway_failure",
                                           "consecutive_local_origin_failure")]  # fmt: skip
        if counts[0] is None and counts[1] is None:
            return None
        return " / ".join("—" if v is None else str(v) for v in counts)
    if key in ("@enforcing", "@sr", "@fp", "@ejection"):
        if outlier is None:
            return None
        names = {
            "@enforcing": (
                "enforcing_consecutive_5xx",
                "enforcing_consecutive_gateway_failure",
                "enforcing_consecutive_local_origin_failure",
            ),
            "@sr": ("enforcing_success_rate", "enforcing_local_origin_success_rate"),
            "@fp": ("enforcing_failure_percentage", "enforcing_failure_percentage_local_origin"),
            "@ejection": ("interval", "base_ejection_time", "max_ejection_time"),
        }[str(key)]
        found = [outlier.get(n) for n in names]
        if any(v is None for v in found):
            return None
        return " / ".join(str(v) for v in found)
    if key == "@health":
        checks = _dig(source, "health_checks")
        if not checks:
            return None
        return ", ".join(
            f"{c.get('http_health_check', {}).get('path')} every {c.get('interval')}"
            for c in checks
        )
    policy = _dig(source, "route", "retry_policy")
    if key == "@ratelimited":
        limited = _dig(policy, "rate_limited_retry_back_off")
        if limited is None:
            return None
        # proto3 JSON leaves out enum defaults: no `format` means SECONDS (0).
        headers = ",".join(
            f"{h.get('name')} {h.get('format', 'SECONDS')}"
            for h in limited.get("reset_headers", [])
        )
        return f"{headers} max {limited.get('max_interval')}"
    if key == "@predicate":
        predicates = _dig(policy, "retry_host_predicate")
        if not predicates:
            return None
        return ", ".join(str(p.get("name", "")).rsplit(".", 1)[-1] for p in predicates)
    if key == "@priority":
        priority = _dig(policy, "retry_priority")
        if priority is None:
            return None
        return str(priority.get("name", "")).rsplit(".", 1)[-1]
    return None


def _statuses(matcher: Any) -> list[str]:
    """The `:status` values a MatchPredicate (as JSON) matches: "429", "500-599", ...;
    anything else it matches on is shown as "other"."""
    found: list[str] = []
    if isinstance(matcher, list):
        for item in matcher:
            found += _statuses(item)
    elif isinstance(matcher, dict):
        exact = matcher.get("string_match", {}).get("exact")
        if "name" in matcher and (exact is not None or "range_match" in matcher):
            if matcher["name"] != ":status":
                found.append("other")
            elif exact is not None:
                found.append(str(exact))
            else:
                span = matcher["range_match"]  # [start, end)
                found.append(f"{int(span.get('start', 0))}-{int(span.get('end', 0)) - 1}")
        elif "name" in matcher:
            found.append("other")
        else:
            for value in matcher.values():
                found += _statuses(value)
    return found


# ----- orchestration ---------------------------------------------------------------------------


@dataclass
class Results:
    one: list[OneFailing]
    what_ifs: list[OneFailing]
    storms: list[Storm]
    keepalive: KeepAlive | None
    quickstart: QuickstartCheck | None
    first_picks: FirstPicks | None = None
    elapsed_s: float = 0.0
    loads: tuple[float, float] = (0.0, 0.0)
    left_running: list[int] = field(default_factory=list)


@contextlib.contextmanager
def work_dir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="resilience-bench-"))
    try:
        yield path
    finally:
        if keep:
            print(f"logs kept in {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


async def failures_and_keepalive(
    gw: UpStack, mocks: dict[str, MockProvider], ca: Path, plan: Plan, results: Results
) -> None:
    # `refused` kills a, so it goes last among the scenarios that need a.
    for fault in ("503", "429", "hang"):
        print(f"part 1: a fails with {FAULT_LABELS[fault]} ...", flush=True)
        results.one.append(await one_failing(gw, mocks, fault, plan))
    print(f"part 1: a fails with {FAULT_LABELS['hang']}, 1 client ...", flush=True)
    results.one.append(await one_failing(gw, mocks, "hang", plan.single(), SEQUENTIAL_HANG))
    for what_if in what_ifs(plan.concurrency):
        print(f"part 1, what-if: {what_if.key} ...", flush=True)
        plan_used = plan.single() if what_if.single else plan
        results.what_ifs.append(await one_failing(gw, mocks, what_if.fault, plan_used, what_if))
    # A route that retries a 429 at once and does not eject on 429.
    print(f"part 1: first picks on route one-{FIRST_PICKS.key} ...", flush=True)
    results.first_picks = await first_picks(gw, mocks, FIRST_PICKS, 40)
    for clients in plan.storm_levels:
        print(f"part 2: both fail with 503, {clients} clients ...", flush=True)
        results.storms.append(await all_failing(gw, mocks, "503", clients, plan.storm_s))
    if plan.hang_storm:
        clients = max(plan.storm_levels)
        print(f"part 2: every attempt hangs, {clients} clients ...", flush=True)
        results.storms.append(await all_failing(gw, mocks, "hang", clients, plan.storm_s))
    print(f"part 1: a fails with {FAULT_LABELS['refused']} ...", flush=True)
    results.one.insert(0, await one_failing(gw, mocks, "refused", plan))
    print("part 3: keep-alive, TLS mock ...", flush=True)
    results.keepalive = await keep_alive(gw, mocks["tls"], ca, plan)


def run(plan: Plan, work: Path, skip_quickstart: bool) -> Results:
    results = Results([], [], [], None, None)
    ports = Ports.pick(("a", "b", "tls"))
    ca, cert, key = make_test_ca(work)
    mocks = {
        "a": start_mock("a", ports.providers["a"], work),
        "b": start_mock("b", ports.providers["b"], work),
        "tls": start_mock("tls", ports.providers["tls"], work, (cert, key)),
    }
    gw: UpStack | None = None
    try:
        for mock in mocks.values():
            mock.wait_ready()
        gw = start_gateway(work, gateway_doc(ports, ca, plan))
        wait_serving(gw, "one-503")
        wait_serving(gw, "ka-pooled")
        _new_event_loop().run_until_complete(failures_and_keepalive(gw, mocks, ca, plan, results))
    finally:
        if gw is not None:
            results.left_running += gw.stop()
        for mock in mocks.values():
            results.left_running += mock.stop()
    if not skip_quickstart:
        print("part 4: the quickstart's config_dump ...", flush=True)
        results.quickstart = quickstart_check(work)
    return results


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


# ----- tables and the reading -----------------------------------------------------------------


def _pct(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:
        return "—"
    return f"{value * 100:.{digits}f} %"


def _secs(value: float | None, window: float) -> str:
    return f"never (within {window:.0f} s)" if value is None else f"{value * 1000:.0f} ms"


def one_table(rows: Sequence[OneFailing]) -> list[str]:
    lines = [
        "| `a` fails with | client requests | errors (whole window) | errors after ejection | "
        "time to ejection (detector) | attempts / request | Envoy retries / request | "
        "retries refused by budget | latency p50 / p99 / max (ms) | errors by status and code |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        after = (
            f"{r.after_errors} / {r.after_requests} ({_pct(r.after_rate)})"
            if r.ejected_after_s is not None
            else "— (not ejected)"
        )
        detector = ", ".join(k.removeprefix("consecutive_") for k in r.ejected_by) or "—"
        ejected = _secs(r.ejected_after_s, r.window_s)
        if r.ejected_after_s is not None:
            ejected += f" ({detector})"
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(r.codes.items())) or "—"
        lines.append(
            f"| {_label(r)} | {r.requests} | {r.errors} ({_pct(r.error_rate)}) | "
            f"{after} | {ejected} | {r.attempts / r.requests:.3f} | "
            f"{r.retries / r.requests:.3f} | {r.retry_overflow} | "
            f"{r.p50_ms:.0f} / {r.p99_ms:.0f} / {r.max_ms:.0f} | {codes} |"
        )
    return lines


def storm_table(rows: Sequence[Storm]) -> list[str]:
    s0 = rows[0]
    lines = [
        "| both fail with | clients | client requests | client errors | attempts / request | "
        f"bound: 1 + {s0.budget_percent:g} % once clients > min_concurrency {s0.min_concurrency},"
        f" else 1 + max_retries | within | Envoy's cap on retries in flight, max("
        f"{s0.budget_percent:g} % x clients, {s0.min_concurrency}) | Envoy retries | "
        "retries refused by budget | ejections | failure latency p50 / p99 / max (ms) |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for s in rows:
        within = "yes" if s.per_request <= s.bound + 1e-9 else "**no**"
        label = "503" if s.fault == "503" else f"hang (first_byte {FIRST_BYTE})"
        lines.append(
            f"| {label} | {s.clients} | {s.requests} | {_pct(s.errors / s.requests, 1)} | "
            f"{s.per_request:.3f} | {s.bound:.2f} | {within} | {s.in_flight_cap:.1f} | "
            f"{s.retries} | {s.retry_overflow} | {s.ejections} | "
            f"{s.p50_ms:.0f} / {s.p99_ms:.0f} / {s.max_ms:.0f} |"
        )
    return lines


def keepalive_table(ka: KeepAlive) -> list[str]:
    base50, base99 = ka.p("direct", 50), ka.p("direct", 99)
    labels = {
        "direct": "direct to the mock, one kept-alive TLS connection (baseline)",
        "pooled": "through Envoy, pooled upstream connections (default)",
        "fresh": "through Envoy, `max_requests_per_connection: 1`",
    }
    lines = [
        "| path | p50 (ms) | p99 (ms) | added p50 (ms) | added p99 (ms) | new connections at "
        "the mock / Envoy `upstream_cx_total` |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for path in KA_PATHS:
        p50, p99 = ka.p(path, 50), ka.p(path, 99)
        added = ("—", "—") if path == "direct" else (f"{p50 - base50:+.2f}", f"{p99 - base99:+.2f}")
        cx = str(ka.envoy_cx[path]) if path in ka.envoy_cx else "—"
        lines.append(
            f"| {labels[path]} | {p50:.2f} | {p99:.2f} | {added[0]} | {added[1]} | "
            f"{ka.new_connections[path]} / {cx} |"
        )
    return lines


def keepalive_ratios(ka: KeepAlive) -> tuple[float, float, float, float]:
    """(added p50 fresh / pooled, added p99 fresh / pooled, p50 fresh / pooled, p99 ...)"""
    base50, base99 = ka.p("direct", 50), ka.p("direct", 99)
    add = {path: (ka.p(path, 50) - base50, ka.p(path, 99) - base99) for path in ("pooled", "fresh")}
    return (
        add["fresh"][0] / add["pooled"][0] if add["pooled"][0] > 0 else float("nan"),
        add["fresh"][1] / add["pooled"][1] if add["pooled"][1] > 0 else float("nan"),
        ka.p("fresh", 50) / ka.p("pooled", 50),
        ka.p("fresh", 99) / ka.p("pooled", 99),
    )


def quickstart_table(check: QuickstartCheck) -> list[str]:
    if check.skipped:
        return [f"Skipped: {check.skipped}."]
    lines = [
        "| setting | " + " | ".join(f"route `{r}`" for r in check.routes) + " |",
        "|---|" + "---|" * len(check.routes),
    ]
    for label, values in check.rows:
        cells = " | ".join(f"`{values[r]}`" if values[r] != "—" else "—" for r in check.routes)
        lines.append(f"| {label} | {cells} |")
    return lines


def config_used() -> str:
    retries, outlier = Retries(), OutlierDetection()
    return (
        f"built-in defaults: retries max_retries {retries.max_retries}, retry_on "
        f"{list(retries.retry_on)}, back-off {retries.backoff.base} ms base / "
        f"{retries.backoff.max} ms max, retry_after_max {retries.retry_after_max} ms, "
        f"other_provider {retries.other_provider}, budget {retries.budget.percent:g} % "
        f"(min_concurrency {retries.budget.min_concurrency}); outlier_detection consecutive_5xx "
        f"{outlier.consecutive_5xx}, consecutive_gateway_failure "
        f"{outlier.consecutive_gateway_failure}, consecutive_local_origin_failure "
        f"{_local_origin(outlier.consecutive_local_origin_failure)}, eject_on_429 "
        f"{json.dumps(outlier.eject_on_429)}, base_ejection_time "
        f"{outlier.base_ejection_time} ms, max_ejection_percent {outlier.max_ejection_percent}; "
        f"only `timeouts.first_byte: {FIRST_BYTE}` set (`defaults:`)"
    )


def _local_origin(threshold: int | None) -> str:
    if threshold is None:
        return (
            "null (split mode off: connect failures, resets and timed-out attempts count as "
            "gateway failures)"
        )
    return f"{threshold} (split mode)"


FAULT_SHORT = {"refused": "connection refused", "503": "503", "429": "429", "hang": "hang"}


def _names(rows: Sequence[OneFailing]) -> str:
    """'503 (8 clients), hang (1 client)': the rows of the main table, briefly."""
    return ", ".join(f"{FAULT_SHORT[r.fault]} ({_clients(r.clients)})" for r in rows) or "none"


def _clients(n: int) -> str:
    return f"{n} client{'s' if n != 1 else ''}"


def _errors(n: int) -> str:
    return f"{n} error{'s' if n != 1 else ''}"


def _sequential_window(rows: Sequence[OneFailing]) -> str:
    single = [r for r in rows if r.clients == 1]
    return f"{single[0].window_s:.0f} s for the 1-client row" if single else "all rows"


def _label(r: OneFailing) -> str:
    clients = f", {_clients(r.clients)}"
    return FAULT_LABELS[r.fault] + clients + (f"; {r.variant}" if r.variant else "")


def reading(results: Results) -> list[str]:
    """The short reading, computed from the figures so that it stays true on a re-run."""
    lines: list[str] = []
    met = [r for r in results.one if r.after_rate is not None and r.after_rate <= AIM_ERROR_RATE]
    missed = [r for r in results.one if r not in met]
    if results.one:
        headline = f"- **Aim ≤ 0.1 % errors after ejection: met for {_names(met)}"
        if missed:
            headline += f"; not met for {_names(missed)}"
            never = [r for r in missed if r.ejected_after_s is None]
            if never:
                headline += f" ({'never ejected' if len(never) == len(missed) else 'see below'})"
        lines.append(headline + ".**")
    if results.storms:
        inside = all(s.per_request <= s.bound + 1e-9 for s in results.storms)
        ratios = ", ".join(f"{s.per_request:.2f} at {s.clients}" for s in results.storms)
        lines.append(
            f"- **All providers failing: attempts per client request "
            f"{'within' if inside else 'NOT within'} the bound at every concurrency "
            f"measured** ({ratios} clients); failures come back fast (no hang beyond the "
            "back-off and the first-byte timeout)."
        )
    fp = results.first_picks
    # More than 10 % above its share: the round robin sends first attempts back to `a`.
    round_robin_note = (
        fp is not None and not fp.ejections and fp.a_failing > max(fp.a_healthy, 1) * 1.1
    )
    for r in [*results.one, *results.what_ifs]:
        label = _label(r)
        if r.ejected_after_s is None:
            lines.append(
                f"- **{label}: never ejected** in {r.window_s:.0f} s; clients saw "
                f"{_errors(r.errors)} in {r.requests} requests ({_pct(r.error_rate)}), "
                f"{r.attempts / r.requests:.3f} attempts per request, p99 {r.p99_ms:.0f} ms."
                + _why_not_ejected(r, round_robin_note)
            )
            continue
        rate = r.after_rate
        ok = rate is not None and rate <= AIM_ERROR_RATE
        lines.append(
            f"- **{label}: {'meets' if ok else 'misses'} the ≤ 0.1 % aim after ejection** "
            f"({_errors(r.after_errors)} in {r.after_requests} requests); ejected "
            f"{r.ejected_after_s * 1000:.0f} ms after the fault started "
            f"({', '.join(r.ejected_by) or '?'}); {_errors(r.errors)} over the whole "
            f"window ({_pct(r.error_rate)}), {r.attempts / r.requests:.3f} upstream attempts "
            "per client request."
            + (
                f" `a` got {r.a_attempts_after_ejection} requests after its ejection was seen."
                if r.a_attempts_after_ejection is not None
                else ""
            )
            + _before_ejection(r)
            + _why_errors(r)
        )
    if fp is not None:
        setting = f"{fp.requests} sequential requests on a 1:1 route with {fp.settings}"
        counts = (
            f"`a` got {fp.a_healthy} first attempts while healthy, {fp.a_failing} while "
            "answering 429 (each retried on `b`)"
        )
        if fp.ejections:
            lines.append(
                f"- First attempts, {setting}: {counts}; but `a` was ejected during them "
                f"({fp.ejections} ejections), so they do not show where first attempts go "
                "while a failing provider stays in."
            )
        elif round_robin_note:
            lines.append(
                "- **A failing provider that is not ejected gets more than its share of first "
                f"attempts.** {setting}: {counts}. The cluster's round robin advances on every "
                "pick, including the retry's pick of `a` that previous_hosts rejects before it "
                "picks `b`, so after each retry the next request starts on `a` again."
            )
        else:
            lines.append(
                f"- A failing provider that is not ejected, {setting}: {counts}, not more "
                "than its share."
            )
    for s in results.storms:
        verdict = "within" if s.per_request <= s.bound + 1e-9 else "**above**"
        what = "503 on both" if s.fault == "503" else f"every attempt hanging, {FIRST_BYTE}"
        why = (
            f"1 + {s.budget_percent:g} %"
            if s.clients > s.min_concurrency
            else f"below min_concurrency {s.min_concurrency} the budget allows every retry: "
            "1 + max_retries"
        )
        lines.append(
            f"- All failing ({what}), {s.clients} clients: {s.per_request:.3f} attempts per "
            f"request, {verdict} the bound {s.bound:.2f} ({why}); {s.retry_overflow} retries "
            f"refused by the budget; {_pct(s.errors / s.requests, 1)} errors, answered in "
            f"p50 {s.p50_ms:.0f} / p99 {s.p99_ms:.0f} / max {s.max_ms:.0f} ms."
        )
    ka = results.keepalive
    if ka is not None:
        r50, r99, t50, t99 = keepalive_ratios(ka)
        lines.append(
            f"- Keep-alive: a new TCP + TLS connection per request adds "
            f"{ka.p('fresh', 50) - ka.p('pooled', 50):.2f} ms at p50 and "
            f"{ka.p('fresh', 99) - ka.p('pooled', 99):.2f} ms at p99 over pooled connections "
            f"(Envoy's added latency over the direct baseline: {r50:.1f}x at p50, {r99:.1f}x "
            f"at p99; end to end {t50:.2f}x / {t99:.2f}x). Pooled: "
            f"{ka.new_connections['pooled']} new connections at the mock for "
            f"{ka.rounds * ka.per_round} requests."
        )
    q = results.quickstart
    if q is not None:
        if q.skipped:
            lines.append(f"- Quickstart config_dump: skipped ({q.skipped}).")
        else:
            state = (
                "every required setting present"
                if not q.missing
                else f"**missing: {'; '.join(q.missing)}**"
            )
            state += (
                "; outlier detection as the quickstart's `outlier_detection` implies (split "
                "mode only where consecutive_local_origin_failure is set, the 429-and-5xx "
                "error_matcher where eject_on_429 is on)"
                if not q.wrong
                else f"; **outlier detection not as configured: {'; '.join(q.wrong)}**"
            )
            lines.append(
                f"- Quickstart config_dump: {state}; provider keys "
                f"{'**appear**' if q.keys_in_dump else 'do not appear'} in "
                "/config_dump?include_eds."
            )
    return lines


def _why_not_ejected(r: OneFailing, round_robin_note: bool) -> str:
    if r.fault == "hang":
        if r.local_origin_threshold is None:
            return (
                " Unexpected: with split mode off its timed-out attempts count as gateway "
                f"failures (consecutive_gateway_failure {r.consecutive_gateway_failure})."
            )
        return (
            " In split mode (`consecutive_local_origin_failure` set) Envoy's router reports "
            "every attempt that gets a connection to `a` as a local-origin *success* "
            "(onPoolReady → LocalOriginConnectSuccess), which resets the "
            "consecutive_local_origin_failure count; the hung attempts' timeouts only count "
            f"if {r.local_origin_threshold} come with no attempt starting on `a` in between, "
            f"which with {_clients(r.clients)} "
            f"{'never happens' if r.clients == 1 else 'did not happen here'}."
        )
    if r.fault != "429":
        return ""
    if r.eject_on_429:
        text = (
            " Unexpected: eject_on_429 counts its 429s toward consecutive_5xx "
            f"({r.consecutive_5xx}). Meanwhile"
        )
    else:
        text = (
            " Envoy's outlier detection counts only 5xx answers and connection-level failures,"
            " so with `eject_on_429: false` a provider answering 429 is never ejected:"
        )
    text += (
        " every request whose first attempt goes to `a` needs a retry "
        f"({r.retries / r.requests * 100:.0f} % of requests were retried; `a` had "
        f"{r.a_share_before * 100:.0f} % of the answers before the fault)."
    )
    if r.retry_after_wait:
        text += (
            " That retry first waits Retry-After (1 to 1.5 s, rate_limited_retry_back_off) "
            "although it goes to the other provider, and holds a retry-budget slot all that "
            f"time: {r.retries} retries in {r.window_s:.0f} s."
        )
    if r.retry_overflow:
        text += (
            f" Retries beyond the budget are refused ({r.retry_overflow} = "
            f"`upstream_rq_retry_overflow`, {_pct(r.retry_overflow / r.requests)} of requests):"
            " those clients get `a`'s 429."
        )
    else:
        text += " No retry was refused."
    first_on_a = r.retries / r.requests
    if first_on_a > r.a_share_before + 0.05:
        text += (
            f" `a` got {first_on_a * 100:.0f} % of the first attempts, not its "
            f"{r.a_share_before * 100:.0f} %"
            + (" (see the round-robin note below)." if round_robin_note else ".")
        )
    return text


def _before_ejection(r: OneFailing) -> str:
    """What the requests went through until a 429 provider was ejected."""
    if r.fault != "429":
        return ""
    text = (
        " Until then every request whose first attempt went to `a` needed a retry on `b` "
        f"({r.retries} retries"
    )
    if r.retry_after_wait:
        text += (
            ", each after waiting Retry-After, 1 to 1.5 s by rate_limited_retry_back_off, "
            "although it goes to the other provider"
        )
    return text + (
        f"); latency p99 {r.p99_ms:.0f} ms over the window, the slowest request {r.max_ms:.0f} ms."
    )


def _why_errors(r: OneFailing) -> str:
    if not r.errors:
        return ""
    codes = ", ".join(f"{k} x{v}" for k, v in sorted(r.codes.items()))
    text = f" Errors: {codes}"
    if r.retry_overflow >= r.errors:
        budget = Retries().budget
        cap = (
            f"max({budget.percent:g} % of the requests in flight, min_concurrency "
            f"{r.min_concurrency})"
        )
        if r.fault == "429" and r.retry_after_wait:
            text += (
                f"; each one a retry the budget refused ({r.retry_overflow} = "
                "`upstream_rq_retry_overflow`): until `a` was ejected, its 429s' retries "
                "waited Retry-After holding their budget slots, and more were needed at once "
                f"than the budget lets be in flight ({cap}) with {_clients(r.clients)}"
            )
        else:
            text += (
                f"; each one a retry the budget refused ({r.retry_overflow} = "
                "`upstream_rq_retry_overflow`): when `a` starts failing, the requests in "
                "flight on it fail at about the same moment, more at once than the budget "
                f"lets retries be in flight ({cap}) with {_clients(r.clients)}"
            )
    return text + "."


def report(command: str, results: Results) -> str:
    lines = [
        f"`{command}` — {today()}; {machine()} (a shared machine: other work ran on the "
        f"same 2 cores; load average (1 min) {results.loads[0]:.1f} at the start, "
        f"{results.loads[1]:.1f} at the end); Envoy 1.40 (`--envoy-concurrency 1`); whole "
        f"run {results.elapsed_s:.0f} s. Generated by `benchmarks/resilience.py` (the "
        "reading too, from the figures).",
        "",
        "Real processes on 127.0.0.1: `sluicegate up FILE --no-mocks` (control plane, "
        "ext_proc, Envoy) and mock providers started by the benchmark as separate "
        "processes. One route per scenario (its own Envoy cluster, so fresh outlier "
        f"state), {config_used()}. Non-streamed chat completions (2 tokens, TTFT 5 ms) from "
        "a closed loop of aiohttp clients (one kept-alive connection each); every process "
        "shares the 2 cores, so throughput is the machine's, not Envoy's.",
        "",
    ]
    if results.one:
        r0 = results.one[0]
        lines += [
            "### One of two providers failing 100%",
            "",
            f"Routes of `a` and `b`, weight 1:1; after {r0.warm_s:.0f} s with "
            f"both healthy, `a` fails for {r0.window_s:.0f} s "
            f"({_sequential_window(results.one)}). *errors (whole window)*: "
            "requests that ended after the fault started; *after ejection*: requests started "
            "after Envoy's `outlier_detection.ejections_enforced_total` for the route's cluster "
            f"was seen > 0 (admin /stats polled every {EJECTION_POLL_S * 1000:.0f} ms; *time to "
            "ejection* is from the fault's start to that). *attempts / request*: upstream "
            "attempts (both mocks' `requests_total` deltas; for connection refused `b`'s plus "
            "Envoy's per-host `rq_total` + `cx_connect_fail` for `a`) over the window's client "
            "requests.",
            "",
            *one_table(results.one),
            "",
        ]
    if results.what_ifs:
        lines += [
            "What-ifs, not the defaults: the same scenarios on routes that override the "
            "settings named (everything else as above). For 429: what limits the errors and "
            "the latency until `a` is ejected (the Retry-After wait, the retry budget), and "
            "what the ejection saves (`eject_on_429: false`); for hang with one client: "
            "split mode, which the defaults leave off:",
            "",
            *one_table(results.what_ifs),
            "",
        ]
    if results.storms:
        lines += [
            "### All providers failing",
            "",
            "Both mocks fail every request for "
            f"{results.storms[0].window_s:.0f} s per row (a route of its own per row). Envoy's "
            "retry budget caps retries *in flight* at max(percent x (active + pending "
            "upstream requests), min_concurrency), not their count: up to min_concurrency "
            "requests in flight every request may use all its retries (bound 1 + "
            "max_retries); above it the count bound checked is 1 + percent. A retry holds its "
            "slot from the failed attempt through the back-off to the end of the retried "
            "attempt, so slow failures (hang) use the budget up more than fast ones (503). "
            "*failure latency*: client-seen time of the failed requests.",
            "",
            *storm_table(results.storms),
            "",
        ]
    if results.keepalive is not None:
        ka = results.keepalive
        lines += [
            "### Keep-alive effect (TLS provider)",
            "",
            f"A TLS mock provider (test CA and P-256 server certificate made with openssl; the "
            f"provider's `tls.ca_file` is the CA, SNI `{SERVER_NAME}`), one request at a time, "
            f"{ka.rounds} rounds x {ka.per_round} requests per path, the order of the paths "
            "rotated per round; the client keeps its connection to Envoy (or to the mock) "
            "alive. *added*: minus the direct path's percentile.",
            "",
            *keepalive_table(ka),
            "",
        ]
    if results.quickstart is not None:
        lines += [
            "### The quickstart's config_dump",
            "",
            "`sluicegate up examples/quickstart.yaml`, Envoy admin on 127.0.0.1:9901, "
            "`/config_dump`: each route's cluster and route entry (— = not set).",
            "",
            *quickstart_table(results.quickstart),
            "",
        ]
    lines += ["### Reading", "", *reading(results)]
    return "\n".join(lines)


# ----- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, write_help="update RESULTS.md (--quick too)")
    parser.add_argument("--quick", action="store_true", help="shorter windows, fewer requests")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--concurrency", type=int, default=8, help="part 1 clients (default 8)")
    parser.add_argument("--skip-quickstart", action="store_true")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    plan = Plan.make(args.quick, args.concurrency)
    command = command_line("benchmarks.resilience", argv)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with work_dir(args.keep_logs) as work:
        results = run(plan, work, args.skip_quickstart)
    results.elapsed_s = time.monotonic() - started
    results.loads = (load_before, os.getloadavg()[0])
    text = report(command, results)
    print("\n" + text)
    leftover = running_children()
    print(
        f"\ntotal {results.elapsed_s:.0f} s; processes that needed SIGKILL: "
        f"{results.left_running or 'none'}; children still running: {leftover or 'none'}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(dataclasses.asdict(results), indent=1, default=str))
    if args.write or not (args.quick or args.no_write):
        update_section(SECTION, text)
        print("updated benchmarks/RESULTS.md")
    return 1 if results.left_running or leftover else 0


if __name__ == "__main__":
    sys.exit(main())
