"""Admission end to end: `sluicegate up` with a real Envoy, the real ext_proc filter and
a mock provider. Keys and tenants, token reservations and their reconcile, rate-limit
headers, priority gates and slot release, and bad input, as a client sees them.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import OpenAI

from sluicegate import wire
from sluicegate.config import hash_key
from tests.e2e.stack import Stack, own_addresses, running_stack
from tests.ports import free_ports

pytestmark = pytest.mark.e2e

KEYS = {
    "team": "sk-test-team-0123456789abcdef",
    "narrow": "sk-test-narrow-0123456789abcdef",
    "tight": "sk-test-tight-0123456789abcdef",
    "batchy": "sk-test-batchy-0123456789abcdef",
}
HELLO: Any = [{"role": "user", "content": "hello"}]
TIGHT_TOKENS = 400  # tenant "tight": tokens per TIGHT_WINDOW
TIGHT_WINDOW = "4s"


def document(tmp: Path) -> dict[str, Any]:
    listen, alpha, keyless, capped = free_ports(4)
    return {
        "version": 1,
        "sluicegate": own_addresses(),
        # Short: a queued request lives on the server's override_message_timeout.
        "limits": {"ext_proc_message_timeout_ms": 1000},
        # Envoy's own usage readers, whose stats a test reads (json_to_metadata's); the
        # native reader's share is tests/e2e/test_native_usage_reader.py's.
        "native_filters": {"module": "off"},
        "admission": {
            "priority_classes": [
                {"name": "interactive", "max_queue": 16, "max_wait": "5s"},
                {"name": "batch", "max_queue": 1, "max_wait": "300ms"},
            ],
            "default_priority": "interactive",
            "default_max_tokens": 64,
        },
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "providers": [
            {
                "name": "alpha",
                "base_url": f"http://127.0.0.1:{alpha}/v1",
                "mock": {"models": [], "ttft_ms": 20, "itl_ms": 5, "output_tokens": 8},
            },
            {
                "name": "keyless",
                "base_url": f"http://127.0.0.1:{keyless}/v1",
                "mock": {"models": [], "ttft_ms": 5, "itl_ms": 1, "output_tokens": 4},
            },
            {
                "name": "capped",
                "base_url": f"http://127.0.0.1:{capped}/v1",
                "mock": {"models": [], "ttft_ms": 5, "itl_ms": 1, "output_tokens": 4},
                # The provider account's own limit, whoever calls.
                "rate_limits": {"requests": 3, "per": "30s"},
            },
        ],
        "routes": [
            {"name": "chat", "models": ["chat"], "backends": [{"provider": "alpha"}]},
            {"name": "capped", "models": ["capped"], "backends": [{"provider": "capped"}]},
            {"name": "plain", "models": ["plain"], "backends": [{"provider": "keyless"}]},
            {
                "name": "gated",
                "models": ["gated"],
                "backends": [{"provider": "alpha"}],
                "concurrency": {"max_requests": 2, "headroom": 0.5},
            },
        ],
        "tenants": [
            {
                "name": "team",
                "priority": "interactive",
                "rate_limits": {"requests": 10_000, "tokens": 10_000_000, "per": "1m"},
                "keys": [{"name": "team-key", "hash": hash_key(KEYS["team"])}],
            },
            {
                "name": "narrow",
                "models": ["plain"],
                "keys": [{"name": "narrow-key", "hash": hash_key(KEYS["narrow"])}],
            },
            {
                "name": "tight",
                "rate_limits": {"tokens": TIGHT_TOKENS, "per": TIGHT_WINDOW},
                "keys": [{"name": "tight-key", "hash": hash_key(KEYS["tight"])}],
            },
            {
                "name": "batchy",
                "priority": "batch",
                "keys": [{"name": "batchy-key", "hash": hash_key(KEYS["batchy"])}],
            },
        ],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("admission")
    with running_stack(tmp, document(tmp)) as running:
        yield running


def client(stack: Stack, tenant: str = "team") -> OpenAI:
    return OpenAI(base_url=stack.gateway + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=20)


def post(
    stack: Stack,
    body: dict[str, Any] | bytes,
    key: str | None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    all_headers = {"content-type": "application/json", **(headers or {})}
    if key is not None:
        all_headers["authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions", data=data, method="POST", headers=all_headers
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return (
                response.status,
                json.load(response),
                {k.lower(): v for k, v in response.headers.items()},
            )
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), {k.lower(): v for k, v in err.headers.items()}


def metrics(stack: Stack) -> str:
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
        return text


def metric(text: str, name: str, default: float | None = None, **labels: str) -> float:
    """The value of one sample (labels must match exactly those given, in any order);
    `default` when there is none yet (a labelled counter appears at its first use)."""
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if found == labels:
            return float(match.group(3))
    if default is not None:
        return default
    raise AssertionError(f"no sample {name}{labels}")


def mock_stats(stack: Stack, provider: str) -> dict[str, Any]:
    base = next(p["base_url"] for p in stack.doc["providers"] if p["name"] == provider)
    with urllib.request.urlopen(base.rsplit("/v1", 1)[0] + "/mock/stats", timeout=5) as response:
        result: dict[str, Any] = json.load(response)
        return result


# ----- keys and tenants ----------------------------------------------------------------


def test_missing_and_wrong_keys_get_401_in_openai_format(stack: Stack) -> None:
    status, body, headers = post(stack, {"model": "chat", "messages": HELLO}, key=None)
    assert status == 401
    assert body["error"]["code"] == "missing_api_key"
    assert headers["content-type"].startswith("application/json")
    status, body, _ = post(stack, {"model": "chat", "messages": HELLO}, key="sk-wrong")
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"
    assert "sk-wrong" not in json.dumps(body)


def test_the_openai_sdk_works_with_a_tenant_key_and_sees_ratelimit_headers(stack: Stack) -> None:
    raw = client(stack).chat.completions.with_raw_response.create(model="chat", messages=HELLO)
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert raw.headers["x-ratelimit-limit-requests"] == "10000"
    assert int(raw.headers["x-ratelimit-remaining-requests"]) < 10_000
    assert raw.headers["x-ratelimit-limit-tokens"] == "10000000"
    assert re.fullmatch(r"[\d.hms]+", raw.headers["x-ratelimit-reset-tokens"])


def test_the_clients_key_never_reaches_a_provider(stack: Stack) -> None:
    status, _, _ = post(stack, {"model": "plain", "messages": HELLO}, key=KEYS["team"])
    assert status == 200
    last = mock_stats(stack, "keyless")["last_request"]
    assert last["authorization_present"] is False


def test_a_model_outside_the_tenants_list_is_403(stack: Stack) -> None:
    status, body, _ = post(stack, {"model": "chat", "messages": HELLO}, key=KEYS["narrow"])
    assert status == 403
    assert body["error"]["code"] == "model_not_allowed"
    status, _, _ = post(stack, {"model": "plain", "messages": HELLO}, key=KEYS["narrow"])
    assert status == 200


def get(stack: Stack, path: str, key: str | None) -> tuple[int, dict[str, Any]]:
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    request = urllib.request.Request(stack.gateway + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_model_listings_need_a_key_and_show_a_tenant_only_its_models(stack: Stack) -> None:
    status, body = get(stack, "/v1/models", None)
    assert (status, body["error"]["code"]) == (401, "missing_api_key")
    status, body = get(stack, "/v1/models/chat", "sk-wrong")
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")

    everything = sorted(client(stack).models.list().model_dump()["data"], key=lambda m: m["id"])
    assert [m["id"] for m in everything] == ["capped", "chat", "gated", "plain"]
    narrow = client(stack, "narrow")
    assert [m.id for m in narrow.models.list()] == ["plain"]
    assert narrow.models.retrieve("plain").id == "plain"
    status, body = get(stack, "/v1/models/chat", KEYS["narrow"])
    assert (status, body["error"]["code"]) == (404, "model_not_found")


# ----- token limits: reserve before admitting, reconcile after --------------------------


def _wait_window_clear(stack: Stack) -> None:
    """Let the tight tenant's window empty (its length, plus a margin)."""
    time.sleep(float(TIGHT_WINDOW.rstrip("s")) + 0.3)


def test_a_request_larger_than_the_limit_is_refused_at_once_and_told_not_to_retry(
    stack: Stack,
) -> None:
    body = {"model": "chat", "messages": HELLO, "max_tokens": TIGHT_TOKENS + 1}
    status, error, headers = post(stack, body, key=KEYS["tight"])
    assert status == 429
    assert error["error"]["code"] == "request_too_large"
    assert error["error"]["type"] == "tokens"
    assert headers["x-should-retry"] == "false"
    assert "retry-after" not in headers
    assert headers[wire.REFUSAL_HEADER] == "request_too_large"


def _usage_reports(stack: Stack, source: str) -> float:
    return metric(metrics(stack), "sluicegate_usage_reports_total", 0, source=source)


def test_reservation_refuses_the_overflowing_request_with_retry_after_and_headers(
    stack: Stack,
) -> None:
    _wait_window_clear(stack)
    # Each reserves its prompt estimate + 150; usage (about 10 tokens) is reconciled after,
    # once the access log has brought it (within its flush interval).
    body = {"model": "chat", "messages": HELLO, "max_tokens": 150}
    for _ in range(3):
        reported = _usage_reports(stack, "provider")
        assert post(stack, body, key=KEYS["tight"])[0] == 200
        deadline = time.monotonic() + 5
        while _usage_reports(stack, "provider") <= reported:
            assert time.monotonic() < deadline, "the record never reconciled the answer"
            time.sleep(0.02)
    # Reconcile gave most of each reservation back, so all three fit...

    # ...while concurrent ones are judged on their reservations alone: one of four fits.
    async def burst() -> list[tuple[int, dict[str, Any], dict[str, str]]]:
        async with aiohttp.ClientSession() as session:

            async def one() -> tuple[int, dict[str, Any], dict[str, str]]:
                async with session.post(
                    stack.gateway + "/v1/chat/completions",
                    json={**body, "max_tokens": 300},
                    headers={"authorization": f"Bearer {KEYS['tight']}", "x-mock-ttft-ms": "1500"},
                ) as response:
                    payload = json.loads(await response.read())
                    headers = {k.lower(): v for k, v in response.headers.items()}
                    return response.status, payload, headers

            return list(await asyncio.gather(*(one() for _ in range(4))))

    results = asyncio.run(burst())
    statuses = [status for status, _, _ in results]
    assert statuses.count(200) == 1, statuses
    assert statuses.count(429) == 3, statuses
    _, error, headers = next(item for item in results if item[0] == 429)
    assert error["error"]["code"] == "rate_limit_exceeded"
    assert error["error"]["type"] == "tokens"
    assert 1 <= int(headers["retry-after"]) <= 5
    assert headers[wire.REFUSAL_HEADER] == "rate_limit_exceeded"
    assert headers["x-ratelimit-limit-tokens"] == str(TIGHT_TOKENS)
    assert int(headers["x-ratelimit-remaining-tokens"]) < 300


def test_streams_reconcile_with_and_without_include_usage(stack: Stack) -> None:
    _wait_window_clear(stack)
    openai = client(stack, "tight")

    def reports(source: str) -> float:
        return metric(metrics(stack), "sluicegate_usage_reports_total", 0, source=source)

    before = {source: reports(source) for source in ("provider", "counted")}
    # Three streams of ~160 reserved each would not fit 400 unless each is reconciled.
    for include_usage in (True, False, True, False):
        source = "provider" if include_usage else "counted"
        seen = reports(source)
        options: Any = {"include_usage": True} if include_usage else None
        stream = openai.chat.completions.create(
            model="chat", messages=HELLO, max_tokens=160, stream=True, stream_options=options
        )
        chunks = list(stream)
        # Client code reading choices[0] of every content chunk keeps working.
        assert any(c.choices and c.choices[0].delta.content for c in chunks)
        assert bool(chunks[-1].usage) is include_usage
        # The observer is never waited on by Envoy: its report comes a moment later.
        deadline = time.monotonic() + 5
        while reports(source) <= seen:
            assert time.monotonic() < deadline, f"no {source} usage report for the stream"
            time.sleep(0.05)
    assert reports("provider") - before["provider"] == 2
    assert reports("counted") - before["counted"] == 2


# ----- priority gate: shedding, slots released ------------------------------------------


def test_batch_is_shed_with_503_and_retry_after_while_interactive_waits(stack: Stack) -> None:
    async def scenario() -> tuple[list[int], list[tuple[int, dict[str, Any], str | None]]]:
        async with aiohttp.ClientSession() as session:

            async def one(tenant: str, ttft: int) -> tuple[int, dict[str, Any], str | None]:
                async with session.post(
                    stack.gateway + "/v1/chat/completions",
                    json={"model": "gated", "messages": HELLO},
                    headers={
                        "authorization": f"Bearer {KEYS[tenant]}",
                        "x-mock-ttft-ms": str(ttft),
                    },
                ) as response:
                    refusal = response.headers.get(wire.REFUSAL_HEADER)
                    body = json.loads(await response.read())
                    assert refusal == (body["error"]["code"] if response.status != 200 else None)
                    return (response.status, body, response.headers.get("retry-after"))

            interactive = [asyncio.create_task(one("team", 800)) for _ in range(4)]
            await asyncio.sleep(0.1)
            batch = [asyncio.create_task(one("batchy", 10)) for _ in range(3)]
            done_interactive = await asyncio.gather(*interactive)
            done_batch = await asyncio.gather(*batch)
            return [s for s, _, _ in done_interactive], list(done_batch)

    interactive, batch = asyncio.run(scenario())
    assert interactive == [200, 200, 200, 200]
    shed = [entry for entry in batch if entry[0] == 503]
    assert shed, batch
    for _status, body, retry_after in shed:
        assert body["error"]["code"] in ("queue_full", "queue_timeout")
        assert retry_after is not None and int(retry_after) >= 1


def test_no_slot_leaks_after_cancelled_failed_and_finished_requests(stack: Stack) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            headers = {"authorization": f"Bearer {KEYS['team']}"}
            url = stack.gateway + "/v1/chat/completions"

            async def finished() -> None:
                async with session.post(
                    url, json={"model": "gated", "messages": HELLO}, headers=headers
                ) as r:
                    await r.read()

            async def failed() -> None:
                fault = {**headers, "x-mock-fault": "500"}
                body = {"model": "gated", "messages": HELLO}
                async with session.post(url, json=body, headers=fault) as r:
                    await r.read()

            async def cancelled_mid_stream() -> None:
                async with session.post(
                    url, json={"model": "gated", "messages": HELLO, "stream": True},
                    headers={**headers, "x-mock-itl-ms": "200", "x-mock-output-tokens": "50"},
                ) as r:  # fmt: skip
                    await r.content.readline()

            async def cancelled_while_queued() -> None:
                task = asyncio.create_task(finished())
                await asyncio.sleep(0.05)
                task.cancel()

            jobs = [finished(), failed(), cancelled_mid_stream(), cancelled_while_queued()] * 4
            await asyncio.gather(*jobs, return_exceptions=True)

    asyncio.run(scenario())
    deadline = time.monotonic() + 10
    while True:
        text = metrics(stack)
        in_flight = metric(text, "sluicegate_gate_in_flight_requests", gate="route:gated")
        depth = metric(text, "sluicegate_queue_depth", gate="route:gated", priority="interactive")
        if (in_flight, depth) == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (in_flight, depth) == (0, 0)
    # The gate still admits: nothing is stuck.
    assert post(stack, {"model": "gated", "messages": HELLO}, key=KEYS["team"])[0] == 200


# ----- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "chat", "messages": HELLO, "max_tokens": -1}, "max_tokens"),
        ({"model": "chat", "messages": HELLO, "max_tokens": 10**12}, "max_tokens"),
        ({"model": "chat", "messages": HELLO, "max_tokens": "many"}, "max_tokens"),
        ({"model": "chat", "messages": HELLO, "n": 0}, "n"),
        ({"messages": HELLO}, "model"),
    ],
)
def test_bad_requests_get_400_naming_the_parameter(
    stack: Stack, body: dict[str, Any], param: str
) -> None:
    status, error, _ = post(stack, body, key=KEYS["team"])
    assert status == 400
    assert error["error"]["param"] == param


def test_not_json_is_400_and_a_bad_priority_header_is_400(stack: Stack) -> None:
    status, error, _ = post(stack, b"{not json", key=KEYS["team"])
    assert (status, error["error"]["code"]) == (400, "invalid_json")
    status, error, _ = post(
        stack, {"model": "chat", "messages": HELLO}, key=KEYS["batchy"],
        headers={"x-sluicegate-priority": "interactive"},
    )  # fmt: skip
    assert status == 400
    assert error["error"]["code"] == "invalid_priority"


def test_admission_metrics_are_exported(stack: Stack) -> None:
    post(stack, {"model": "chat", "messages": HELLO}, key=KEYS["team"])
    text = metrics(stack)
    assert (
        metric(
            text, "sluicegate_admission_decisions_total", outcome="admitted", priority="interactive"
        )
        >= 1
    )
    assert (
        metric(
            text, "sluicegate_admission_decisions_total", outcome="unauthenticated", priority="none"
        )
        >= 1
    )
    assert "sluicegate_tokens_reserved_total" in text
    assert "sluicegate_queue_time_seconds_bucket" in text


# ----- a misbehaving provider: the observer never crashes, the client gets the bytes -----


def test_malformed_sse_from_a_provider_ends_cleanly_and_is_charged_by_count(stack: Stack) -> None:
    _wait_window_clear(stack)
    before = metric(metrics(stack), "sluicegate_usage_reports_total", 0, source="counted")
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions",
        data=json.dumps(
            {"model": "chat", "messages": HELLO, "stream": True, "max_tokens": 100,
             "stream_options": {"include_usage": True}}
        ).encode(),
        headers={"authorization": f"Bearer {KEYS['tight']}", "content-type": "application/json",
                 "x-mock-fault": "garbage"},
        method="POST",
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=20) as response:
        raw = response.read()
    assert b"data: {this is not json" in raw  # passed through untouched
    assert raw.rstrip().endswith(b"data: [DONE]")
    deadline = time.monotonic() + 5
    while metric(metrics(stack), "sluicegate_usage_reports_total", 0, source="counted") <= before:
        assert time.monotonic() < deadline, "the usage observer never reconciled the stream"
        time.sleep(0.05)
    # The filter still admits and answers: nothing crashed.
    assert (
        post(stack, {"model": "chat", "messages": HELLO, "max_tokens": 20}, KEYS["tight"])[0] == 200
    )


def test_a_provider_json_body_that_does_not_parse_keeps_the_estimate_charged(stack: Stack) -> None:
    before = metric(metrics(stack), "sluicegate_usage_reports_total", 0, source="estimate")
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions",
        data=json.dumps({"model": "chat", "messages": HELLO}).encode(),
        headers={"authorization": f"Bearer {KEYS['team']}", "content-type": "application/json",
                 "x-mock-fault": "garbage"},
        method="POST",
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=20) as response:
        assert response.status == 200
        assert response.read().startswith(b'{"id": "chatcmpl-broken"')
    deadline = time.monotonic() + 5
    while metric(metrics(stack), "sluicegate_usage_reports_total", 0, source="estimate") <= before:
        assert time.monotonic() < deadline, "the usage observer never reconciled the answer"
        time.sleep(0.05)


def test_a_providers_rate_limit_holds_across_tenants(stack: Stack) -> None:
    body = {"model": "capped", "messages": HELLO}
    statuses = [post(stack, body, key=KEYS[tenant])[0] for tenant in ("team", "tight", "batchy")]
    assert statuses == [200, 200, 200]
    status, error, headers = post(stack, body, key=KEYS["team"])
    assert status == 429
    assert error["error"]["type"] == "requests"
    assert "provider capped" in error["error"]["message"]
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers[wire.REFUSAL_HEADER] == "rate_limit_exceeded"


def test_a_providers_own_429_is_not_marked_as_the_gateways_refusal(stack: Stack) -> None:
    status, error, headers = post(
        stack,
        {"model": "chat", "messages": HELLO},
        key=KEYS["team"],
        headers={"x-mock-fault": "429", "x-mock-retry-after": "1"},
    )
    # The provider's own OpenAI error passes through, with the same code a gateway's
    # limit would give: only the header tells them apart.
    assert (status, error["error"]["code"]) == (429, "rate_limit_exceeded")
    assert wire.REFUSAL_HEADER not in headers


def test_status_shows_the_gates_and_the_store(stack: Stack) -> None:
    admission = stack.status()["admission"]
    assert admission["enabled"] is True
    assert admission["tenants"] == ["batchy", "narrow", "team", "tight"]
    assert admission["store"]["kind"] == "memory"
    gate = admission["gates"]["route:gated"]
    assert gate["in_flight"] == 0
    assert gate["max_requests"] == 2


def test_a_request_queued_longer_than_the_message_timeout_is_still_served(stack: Stack) -> None:
    """Envoy's ext_proc message timeout is 1 s here; a request waiting 2 s at the gate is
    answered, because the filter extends that timeout before it waits."""

    async def scenario() -> tuple[list[int], float]:
        async with aiohttp.ClientSession() as session:
            headers = {"authorization": f"Bearer {KEYS['team']}"}
            url = stack.gateway + "/v1/chat/completions"
            body = {"model": "gated", "messages": HELLO}

            async def one(extra: dict[str, str]) -> tuple[int, float]:
                async with session.post(url, json=body, headers={**headers, **extra}) as r:
                    await r.read()
                    return r.status, float(r.headers[wire.QUEUE_MS_HEADER])

            holders = [asyncio.create_task(one({"x-mock-ttft-ms": "2000"})) for _ in range(2)]
            deadline = time.monotonic() + 5
            while stack.status()["admission"]["gates"]["route:gated"]["in_flight"] < 2:
                assert time.monotonic() < deadline, "the two holders never took the gate"
                await asyncio.sleep(0.02)
            started = time.monotonic()
            queued = await one({})
            waited = time.monotonic() - started
            return [*await asyncio.gather(*holders), queued], waited

    answers, waited = asyncio.run(scenario())
    assert [status for status, _ in answers] == [200, 200, 200]
    assert waited > 1.2  # it really waited past Envoy's 1 s message timeout
    # The client is told how long it queued: the holders did not, the last one did.
    assert [queue_ms for _, queue_ms in answers[:2]] == [0, 0]
    assert 1000 < answers[2][1] <= waited * 1000


def _observer_streams(stack: Stack) -> int:
    """Streams Envoy opened to the usage observer (its ext_proc stats prefix)."""
    with urllib.request.urlopen(stack.admin + "/stats?filter=usage_observer", timeout=5) as r:
        text = r.read().decode()
    found = re.findall(r"^\S*usage_observer\S*streams_started: (\d+)$", text, re.M)
    assert found, text
    return sum(int(value) for value in found)


def _usage_bodies_read(stack: Stack) -> int:
    """Response bodies Envoy's json_to_metadata looked at (any outcome)."""
    with urllib.request.urlopen(stack.admin + "/stats?filter=json_to_metadata", timeout=5) as r:
        text = r.read().decode()
    return sum(int(value) for value in re.findall(r"^\S*\.resp\.\S+: (\d+)$", text, re.M))


def test_only_a_json_answer_that_may_be_large_reaches_the_observer(
    stack: Stack,
) -> None:
    """A small JSON answer opens no observer stream (Envoy reads its usage into the
    request record); a JSON answer that may be large does, and Envoy does not parse it;
    a stream opens none either: Envoy reads its usage event (sse_to_metadata)."""
    openai = client(stack)
    streams, provider = _observer_streams(stack), _usage_reports(stack, "provider")
    parsed = _usage_bodies_read(stack)
    for _ in range(3):
        answer = openai.chat.completions.create(model="chat", messages=HELLO, max_tokens=8)
        assert answer.usage is not None
    deadline = time.monotonic() + 5
    while _usage_reports(stack, "provider") < provider + 3:
        assert time.monotonic() < deadline, "the records never reconciled the answers"
        time.sleep(0.02)
    assert _observer_streams(stack) == streams
    assert _usage_bodies_read(stack) == parsed + 3
    # Log probabilities: the answer may be large, so the observer reads it, not Envoy.
    answer = openai.chat.completions.create(
        model="chat", messages=HELLO, max_tokens=8, logprobs=True
    )
    assert answer.usage is not None
    provider += 3
    deadline = time.monotonic() + 5
    while _usage_reports(stack, "provider") < provider + 1:
        assert time.monotonic() < deadline, "the observer never reconciled the answer"
        time.sleep(0.02)
    assert _observer_streams(stack) == streams + 1
    assert _usage_bodies_read(stack) == parsed + 3
    streams, provider = streams + 1, provider + 1
    chunks = list(
        openai.chat.completions.create(
            model="chat", messages=HELLO, max_tokens=8, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[-1].usage is not None
    deadline = time.monotonic() + 5
    while _usage_reports(stack, "provider") < provider + 1:
        assert time.monotonic() < deadline, "the record never reconciled the stream"
        time.sleep(0.02)
    assert _observer_streams(stack) == streams
    assert _usage_bodies_read(stack) == parsed + 3
