"""A route's gate in the fast lane (docs/fast-lane.md): `sluicegate up` on the quickstart
with two `fast` tenants, one of the default class and one of the top class, and route
`qwen` gated at 4 requests with headroom 0.5, through a real Envoy.

Envoy enforces the gate with the route cluster's circuit breakers (model.EnvoyGate):
DEFAULT priority holds the lower classes' share (2 in flight, a queue of 2), HIGH the
top class's (2 in flight, a queue of 2); each priority's pending limit is its queue plus
its share in flight (model.resolve_envoy_gate: a request waiting for its connection to
open is pending too). The mock provider answers slowly, so requests overlap; its
`max_in_flight` (/mock/stats) shows what reached it at once. A request over its
priority's in-flight share and pending limit is refused at once, 503 `upstream_overflow`
with Retry-After, and none opens a stream to the routing stage. A route reached by an
exact-lane (or `auto`) tenant too keeps its gate in the routing stage, so validation
refuses the config.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluicegate import wire
from sluicegate.config import ConfigError, load_config_text, validate_text
from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import Answer, Stack, keyed_tenant, post_chat, running_stack

MODEL = "qwen-plus"  # route qwen's, served by alpha alone
ROUTE = "qwen"
CLUSTER = f"route-{ROUTE}"
GATE, HEADROOM = 4, 0.5
DEFAULT_IN_FLIGHT, DEFAULT_QUEUE = 2, 2  # floor(4 * 0.5); standard's max_queue
HIGH_IN_FLIGHT, HIGH_QUEUE = 2, 2  # the rest of the gate; interactive's max_queue
# Envoy's pending limits: the queue plus the share in flight.
DEFAULT_WAITING, HIGH_WAITING = DEFAULT_QUEUE + DEFAULT_IN_FLIGHT, HIGH_QUEUE + HIGH_IN_FLIGHT
FLOOD = 10
# Long enough that every request of a burst reaches Envoy before the first is answered
# (they are sent at once; nothing here measures time).
SLOW_MS = 2000
KEYS = {
    "flood": "sk-sg-e2e-flood-00000000000000000000",
    "vip": "sk-sg-e2e-vip-0000000000000000000000",
    "second": "sk-sg-e2e-second-0000000000000000000",
}


def _tenant(tmp: Path, name: str, **extra: Any) -> dict[str, Any]:
    return keyed_tenant(tmp, name, KEYS[name], **extra)


def fast_lane_gate(tmp: Path) -> dict[str, Any]:
    """The quickstart in the fast lane with one gate, route qwen's; two priority classes
    with small queues; tenant flood of the default class, vip of the top class. Alpha
    has no health check: its probes would count in the mock's requests in flight."""
    doc = quickstart_on_free_ports(tmp)
    for route in doc["routes"]:
        route.pop("concurrency", None)
        if route["name"] == ROUTE:
            route["concurrency"] = {"max_requests": GATE, "headroom": HEADROOM}
    (alpha,) = [p for p in doc["providers"] if p["name"] == "alpha"]
    alpha.pop("health_check")
    admission = doc["admission"]
    admission["lane"] = "fast"
    admission["priority_classes"] = [
        {"name": "interactive", "max_queue": HIGH_QUEUE, "max_wait": "10s"},
        {"name": "standard", "max_queue": DEFAULT_QUEUE, "max_wait": "30s"},
    ]
    admission["default_priority"] = "standard"
    doc["tenants"] = [_tenant(tmp, "flood"), _tenant(tmp, "vip", priority="interactive")]
    return doc


def _post(stack: Stack, tenant: str, **headers: str) -> Answer:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    return post_chat(stack, body, {"authorization": f"Bearer {KEYS[tenant]}", **headers})


def _burst(stack: Stack, tenant: str, count: int) -> list[Answer]:
    """`count` requests whose bytes all reach Envoy at once: each on a connection opened
    first, all sent in one loop, so Envoy reads them together, before any connection to
    the provider can open (a thread per request spreads them over milliseconds)."""
    url = urllib.parse.urlsplit(stack.gateway)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEYS[tenant]}"}
    connections = [http.client.HTTPConnection(url.netloc, timeout=30) for _ in range(count)]
    try:
        for connection in connections:
            connection.connect()
        for connection in connections:
            connection.request("POST", "/v1/chat/completions", body, headers)
        answers = []
        for connection in connections:
            response = connection.getresponse()
            answers.append(Answer(response.status, response.headers, response.read().decode()))
        return answers
    finally:
        for connection in connections:
            connection.close()


def _mock(stack: Stack, path: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Alpha's introspection: GET /mock/stats, or POST /mock/reset or /mock/config."""
    (alpha,) = [p for p in stack.doc["providers"] if p["name"] == "alpha"]
    request = urllib.request.Request(
        alpha["base_url"].removesuffix("/v1") + path,
        data=None if changes is None else json.dumps(changes).encode(),
        method="GET" if changes is None else "POST",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        result: dict[str, Any] = json.load(response)
        return result


def _cluster(stack: Stack) -> dict[str, int]:
    """Envoy's counters and gauges of the gated route's cluster."""
    prefix = f"cluster.{CLUSTER}."
    stats = stack.admin_json(f"/stats?format=json&filter={prefix}")["stats"]
    return {
        s["name"].removeprefix(prefix): int(s["value"])
        for s in stats
        if s.get("name", "").startswith(prefix) and isinstance(s.get("value"), int | float)
    }


def _ext_proc_streams(stack: Stack) -> int:
    """Streams opened by every ext_proc filter Envoy holds (the routing stage's, counted
    by its cluster, and the per-attempt and error-body stages' own stats)."""
    stats = stack.admin_json("/stats?format=json&filter=ext_proc")["stats"]
    opened = [
        int(s["value"])
        for s in stats
        if "ext_proc" in s.get("name", "") and s["name"].endswith(".streams_started")
    ]
    assert opened, "Envoy holds no ext_proc filter stats"  # the stats' names changed
    return sum(opened) + stack.routing_stage_streams()


def _wait(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 15
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _warm(stack: Stack) -> None:
    """Open each priority's connections before a burst, so that it meets the pending
    limit of a warm pool (in flight, then the whole pending limit waiting), not a cold one
    (every request pending while the connections open). Two overlapping requests of each
    class leave 2 idle connections in each priority's pool."""
    _mock(stack, "/mock/config", {"ttft_ms": 300, "output_tokens": 1})
    with ThreadPoolExecutor(4) as pool:
        warming = [pool.submit(_post, stack, tenant) for tenant in ("flood", "vip") * 2]
        assert [answer.result().status for answer in warming] == [200] * 4
    assert _cluster(stack)["upstream_cx_active"] == DEFAULT_IN_FLIGHT + HIGH_IN_FLIGHT
    _mock(stack, "/mock/config", {"ttft_ms": SLOW_MS})
    _mock(stack, "/mock/reset", {})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("fast_lane_gate")
    with running_stack(tmp_path, fast_lane_gate(tmp_path)) as running:
        yield running


def _statuses(answers: list[Answer]) -> Counter[int]:
    return Counter(answer.status for answer in answers)


def _assert_overflows(answers: list[Answer]) -> None:
    """Every answer is a 200 or Envoy's refusal of a full gate, in OpenAI's form."""
    assert set(_statuses(answers)) <= {200, 503}, [(a.status, a.text) for a in answers]
    for refused in (answer for answer in answers if answer.status == 503):
        assert refused.error["code"] == "upstream_overflow", refused.text
        assert refused.error["type"] == "server_error"
        assert refused.headers["retry-after"] == "1"
        assert refused.headers[wire.REFUSAL_HEADER] == "upstream_overflow"


def _results(futures: list[Future[Answer]]) -> list[Answer]:
    return [future.result() for future in futures]


@pytest.mark.e2e
def test_a_burst_on_cold_connections_is_served_up_to_the_share_and_queue(stack: Stack) -> None:
    """First in this file: no connection to the provider is open yet. A burst of the top
    class's share in flight plus its class's queue is all pending while its connections
    open, and all of it is served (with a pending limit of the queue alone, Envoy refused
    some of it under the gate); the provider never has more than the share."""
    assert _cluster(stack).get("upstream_cx_active", 0) == 0
    _mock(stack, "/mock/config", {"ttft_ms": SLOW_MS, "output_tokens": 1})
    _mock(stack, "/mock/reset", {})
    burst = HIGH_IN_FLIGHT + HIGH_QUEUE
    answers = _burst(stack, "vip", burst)
    _assert_overflows(answers)
    assert _statuses(answers) == {200: burst}
    assert _mock(stack, "/mock/stats")["max_in_flight"] == HIGH_IN_FLIGHT
    assert _ext_proc_streams(stack) == 0


@pytest.mark.e2e
def test_a_flood_of_the_default_class_holds_its_share_and_the_rest_is_refused(
    stack: Stack,
) -> None:
    """10 at once on warm connections: 2 reach the provider, 4 wait in Envoy's queue and
    are answered after them, 4 are refused at once; the provider never has more than 2."""
    _warm(stack)
    with ThreadPoolExecutor(FLOOD) as pool:
        answers = _results([pool.submit(_post, stack, "flood") for _ in range(FLOOD)])
    _assert_overflows(answers)
    served = DEFAULT_IN_FLIGHT + DEFAULT_WAITING
    assert _statuses(answers) == {200: served, 503: FLOOD - served}
    stats = _mock(stack, "/mock/stats")
    assert stats["max_in_flight"] == DEFAULT_IN_FLIGHT
    assert stats["by_model"] == {MODEL: served}
    cluster = _cluster(stack)
    assert cluster["upstream_rq_pending_overflow"] == FLOOD - served
    assert _ext_proc_streams(stack) == 0


@pytest.mark.e2e
def test_the_top_class_keeps_its_share_while_the_default_one_is_full(stack: Stack) -> None:
    """While the flood holds DEFAULT (2 at the provider, 4 queued), vip's requests take
    HIGH: 2 at the provider beside the flood's, 4 queued, one over refused. A vip request
    asking for the lower class takes DEFAULT, and is refused with it. The provider
    never has more than the gate."""
    _warm(stack)
    overflowed_before = _cluster(stack)["upstream_rq_pending_overflow"]
    with ThreadPoolExecutor(FLOOD + HIGH_IN_FLIGHT + HIGH_WAITING + 2) as pool:
        flood = [pool.submit(_post, stack, "flood") for _ in range(FLOOD)]

        def default_full() -> bool:
            cluster = _cluster(stack)
            return (
                cluster["circuit_breakers.default.remaining_rq"] == 0
                and cluster["circuit_breakers.default.remaining_pending"] == 0
                and _mock(stack, "/mock/stats")["in_flight"] == DEFAULT_IN_FLIGHT
            )

        _wait("the flood holds DEFAULT's requests and queue", default_full)
        # `up`'s /status and /metrics show the gate as full as Envoy holds it.
        gate = stack.status()["envoy_gates"][ROUTE]
        assert [
            (p["partition"], p["in_flight"], p["max_requests"], p["waiting"], p["max_pending"])
            for p in gate["partitions"]
        ] == [
            ("top", 0, HIGH_IN_FLIGHT, 0, HIGH_WAITING),
            ("rest", DEFAULT_IN_FLIGHT, DEFAULT_IN_FLIGHT, DEFAULT_WAITING, DEFAULT_WAITING),
        ]
        assert gate["partitions"][0]["class"] == "interactive"
        in_flight = "sluicegate_envoy_gate_in_flight_requests"
        assert stack.metric_sum(in_flight, route=ROUTE, partition="rest") == DEFAULT_IN_FLIGHT
        assert stack.metric_sum(in_flight, route=ROUTE, partition="top") == 0
        lowered = _post(stack, "vip", **{wire.PRIORITY_HEADER: "standard"})
        vip = _results(
            [pool.submit(_post, stack, "vip") for _ in range(HIGH_IN_FLIGHT + HIGH_WAITING + 1)]
        )
        flooded = _results(flood)
    _assert_overflows([*flooded, *vip, lowered])
    assert lowered.status == 503
    assert _statuses(vip) == {200: HIGH_IN_FLIGHT + HIGH_WAITING, 503: 1}
    served = DEFAULT_IN_FLIGHT + DEFAULT_WAITING
    assert _statuses(flooded) == {200: served, 503: FLOOD - served}
    # Both shares at once at the provider, and no more.
    assert _mock(stack, "/mock/stats")["max_in_flight"] == GATE
    overflowed = _cluster(stack)["upstream_rq_pending_overflow"] - overflowed_before
    assert overflowed == FLOOD - served + 1 + 1
    assert stack.status()["envoy_gates"][ROUTE]["refused"] == overflowed + overflowed_before
    assert _ext_proc_streams(stack) == 0


@pytest.mark.e2e
def test_two_envoy_workers_never_pass_the_gate(tmp_path: Path) -> None:
    """With 2 Envoy workers (`sluicegate up`'s default) each worker has its own
    connection pools, so which requests wait and which are refused depends on the worker
    they reach (docs/fast-lane.md, "Gates in the fast lane"); the partitions' bounds in
    flight are the route's and hold: the flood's share alone, then both shares, never
    more, and every refusal is the gate's 503."""
    with running_stack(tmp_path, fast_lane_gate(tmp_path), "--envoy-concurrency", "2") as two:
        _mock(two, "/mock/config", {"ttft_ms": SLOW_MS, "output_tokens": 1})
        _mock(two, "/mock/reset", {})
        with ThreadPoolExecutor(FLOOD) as pool:
            flood = _results([pool.submit(_post, two, "flood") for _ in range(FLOOD)])
        _assert_overflows(flood)
        assert _statuses(flood)[200] >= DEFAULT_IN_FLIGHT
        assert _mock(two, "/mock/stats")["max_in_flight"] <= DEFAULT_IN_FLIGHT
        # The flood reached both workers (each counts its own connections).
        stats = two.admin_json("/stats?format=json&filter=worker_")["stats"]
        busy = {
            s["name"].split(".worker_")[1].split(".")[0]
            for s in stats
            if s.get("name", "").endswith(".downstream_cx_total") and s.get("value", 0) > 0
        }
        assert busy == {"0", "1"}, stats
        with ThreadPoolExecutor(2 * FLOOD) as pool:
            both = [pool.submit(_post, two, tenant) for tenant in ("flood", "vip") * FLOOD]
            answers = _results(both)
        _assert_overflows(answers)
        vip = answers[1::2]
        assert _statuses(vip)[200] >= HIGH_IN_FLIGHT
        assert _mock(two, "/mock/stats")["max_in_flight"] <= GATE
        assert _ext_proc_streams(two) == 0


# ----- validation: a gate reached by both lanes is refused ---------------------------


def _with_tenant_of_lane(tmp: Path, lane: str) -> tuple[str, int]:
    """The test's config plus a tenant of `lane` allowed the gated model, as YAML, and
    the line of route qwen's `concurrency` key."""
    doc = fast_lane_gate(tmp)
    doc["tenants"].append(_tenant(tmp, "second", lane=lane))
    text = yaml.safe_dump(doc, sort_keys=False)
    (line,) = [n for n, row in enumerate(text.splitlines(), 1) if row.strip() == "concurrency:"]
    return text, line


def _route_index(text: str) -> int:
    routes = yaml.safe_load(text)["routes"]
    (index,) = [i for i, route in enumerate(routes) if route["name"] == ROUTE]
    return index


def test_the_test_config_itself_is_valid(tmp_path: Path) -> None:
    doc = fast_lane_gate(tmp_path)
    path = tmp_path / "gate.yaml"
    problems = validate_text(yaml.safe_dump(doc, sort_keys=False), str(path))
    assert [p for p in problems if p.is_error] == []


@pytest.mark.parametrize("lane", ["exact", "auto"])
def test_a_gate_reached_by_an_exact_lane_tenant_too_is_refused_at_its_key(
    tmp_path: Path, lane: str
) -> None:
    """An `auto` tenant's requests for a gated model take the exact lane: one gate
    cannot be Envoy's and the routing stage's at once."""
    text, line = _with_tenant_of_lane(tmp_path, lane)
    path = tmp_path / "gate.yaml"
    key = f"routes[{_route_index(text)}].concurrency"
    problems = [p for p in validate_text(text, str(path)) if p.is_error]
    (problem,) = [p for p in problems if p.key_path == key]
    assert problem.line == line
    assert f"route '{ROUTE}'s gate is reached by fast-lane requests and by exact-lane ones" in (
        problem.message
    )
    with pytest.raises(ConfigError) as refused:
        load_config_text(text, str(path))
    assert f"{path}:{line}: {key}: " in str(refused.value)
    # As a user sees it.
    path.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "validate", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert f"{path}:{line}: {key}: route '{ROUTE}'s gate" in result.stderr
