"""Every admitted request is charged exactly once, by the documented rule (issue 9, part 4).

`sluicegate up` with a real Envoy and the real ext_proc servers, in front of a provider
that answers each shape on request (scripted_provider.py). For each answer shape, one
request; then the counters say who reported its usage (`usage_reports_total{source}`),
once, and what it was charged (`tokens_charged_total`), by filters/admission/charge.py:
the provider's usage when it gives one, a stream's content events without it, the
estimate for a JSON answer without usage, nothing for an error or an unanswered request;
and, for streams, whether the client received a usage event: only when it asked for one
(or the provider put usage on a content event).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from sluicegate.config import hash_key
from tests.e2e.stack import Stack, own_addresses, running_stack
from tests.ports import free_ports

from .scripted_provider import (
    ANSWER_HEADER,
    COMPLETION_TOKENS,
    CONTENT_CHUNKS,
    CONTENT_TYPE_HEADER,
    PROMPT_TOKENS,
    STATUS_HEADER,
    provider_section,
    scripted_provider,
)

pytestmark = pytest.mark.e2e

KEY = "sk-test-charge-0123456789abcdef"
MAX_TOKENS = 10
SOURCES = ("provider", "counted", "estimate", "error")
# After the first report, how long a second one would take at most to show: the usage
# log flushes every 100 ms, the observer charges when the response ends.
SETTLE_S = 1.5
REPORT_WAIT_S = 20.0
USAGE_EVENT = re.compile(rb'"usage":\s*\{')


@dataclass(frozen=True)
class Case:
    shape: str
    stream: bool = False
    include_usage: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    client_cut: str | None = None  # "before_headers" or "mid_stream"
    source: str = "provider"
    charged: str = "usage"  # "usage", "estimate", "counted:<n>" or "nothing"
    # A stream: whether the client receives a usage event (None: not checked).
    client_sees_usage: bool | None = None


CT, STATUS = CONTENT_TYPE_HEADER, STATUS_HEADER
CASES = {
    "json": Case("json"),
    "json charset=utf-8": Case("json", headers=((CT, "application/json; charset=utf-8"),)),
    "json;charset=UTF-8": Case("json", headers=((CT, "application/json;charset=UTF-8"),)),
    "json +json type": Case("json", headers=((CT, "application/vnd.api+json"),)),
    "json without usage": Case("json-no-usage", source="estimate", charged="estimate"),
    "json malformed": Case("json-malformed", source="estimate", charged="estimate"),
    "sse with usage": Case("sse-usage", stream=True, include_usage=True, client_sees_usage=True),
    # The client did not ask: the gateway asks for the usage event and cuts it out
    # (filters/usage_reader.py, xds/translate/stream_usage.py).
    "sse with usage asked for the client": Case(
        "sse-usage", stream=True, client_sees_usage=False
    ),
    "sse with usage asked, CRLF": Case("sse-usage-crlf", stream=True, client_sees_usage=False),
    # A stream sent whole with a content-length: the cut body goes chunked, not short.
    "sse with usage asked, sent whole": Case(
        "sse-usage-whole", stream=True, client_sees_usage=False
    ),
    # Usage on the last content event: the event is the client's, so it passes.
    "sse with usage on a content event": Case(
        "sse-usage-on-content", stream=True, client_sees_usage=True
    ),
    # Split across two reads: held back until whole, then cut.
    "sse with a split usage event": Case("sse-usage-split", stream=True, client_sees_usage=False),
    # Usage on the last content event and in the event asked for: only the latter is cut.
    "sse with usage on a content event and asked for": Case(
        "sse-usage-on-content-and-asked", stream=True, client_sees_usage=True
    ),
    # Responses API events counted as usage.py counts them: the deltas, not their `done`.
    "responses stream cut": Case(
        "sse-responses-cut", stream=True, source="counted", charged=f"counted:{CONTENT_CHUNKS}"
    ),
    # Text after an empty or null `content` (reasoning, a tool call's arguments) counts.
    "tool call stream cut": Case(
        "sse-tools-cut", stream=True, source="counted", charged=f"counted:{CONTENT_CHUNKS + 1}"
    ),
    # No event with text, usage never comes: a count of 0, not the estimate.
    "sse with no text": Case("sse-empty", stream=True, source="counted", charged="counted:0"),
    # A provider that ignores include_usage: counted.
    "sse without usage": Case(
        "sse",
        stream=True,
        source="counted",
        charged=f"counted:{CONTENT_CHUNKS}",
        client_sees_usage=False,
    ),
    "sse malformed": Case("sse-malformed", stream=True, source="counted", charged="counted:1"),
    "json error 500": Case(
        "error-json", headers=((STATUS, "500"),), source="error", charged="nothing"
    ),
    "json error 429": Case(
        "error-json", headers=((STATUS, "429"),), source="error", charged="nothing"
    ),
    "text error 400": Case("error-text", source="error", charged="nothing"),
    "stream text error 400": Case("error-text", stream=True, source="error", charged="nothing"),
    "stream json error 503": Case(
        "error-json", stream=True, headers=((STATUS, "503"),), source="error", charged="nothing"
    ),
    "stream cut by the provider": Case(
        "sse-cut", stream=True, source="counted", charged=f"counted:{CONTENT_CHUNKS}"
    ),
    # What was seen: the chunks that reached Envoy before the client left (1 to all).
    "stream cut by the client": Case(
        "sse-hang",
        stream=True,
        client_cut="mid_stream",
        source="counted",
        charged=f"counted:1-{CONTENT_CHUNKS}",
    ),
    "json left by the client before an answer": Case(
        "hang", client_cut="before_headers", source="error", charged="nothing"
    ),
    "stream left by the client before an answer": Case(
        "hang", stream=True, client_cut="before_headers", source="error", charged="nothing"
    ),
}


def document(provider_port: int) -> dict[str, Any]:
    (listen,) = free_ports(1)
    return {
        "version": 1,
        "sluicegate": own_addresses(),
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "providers": [provider_section("scripted", provider_port)],
        # No retries: a retried error would be a second answer to charge by.
        "routes": [
            {
                "name": "chat",
                "models": ["chat"],
                "backends": [{"provider": "scripted"}],
                "retries": {"max_retries": 0},
            }
        ],
        "tenants": [
            {
                "name": "team",
                "rate_limits": {"tokens": 10_000_000, "per": "1m"},
                "keys": [{"name": "k", "hash": hash_key(KEY)}],
            }
        ],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("charge_once")
    (port,) = free_ports(1)
    with scripted_provider(port), running_stack(tmp, document(port)) as running:
        yield running


def counters(stack: Stack) -> dict[str, float]:
    """usage_reports_total by source, tokens charged (input, output) and reserved."""
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = dict.fromkeys([*SOURCES, "input", "output", "reserved"], 0.0)
    for line in text.splitlines():
        match = re.match(r'sluicegate_usage_reports_total\{source="(\w+)"\} (\S+)', line)
        if match:
            values[match[1]] = float(match[2])
        match = re.match(r'sluicegate_tokens_charged_total\{.*type="(\w+)".*\} (\S+)', line)
        if match:
            values[match[1]] += float(match[2])
        match = re.match(r"sluicegate_tokens_reserved_total\{.*\} (\S+)", line)
        if match:
            values["reserved"] += float(match[1])
    return values


async def send(stack: Stack, case: Case) -> bytes | None:
    """The answer's body as the client received it (None: cut, or no answer)."""
    body: dict[str, Any] = {
        "model": "chat",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": MAX_TOKENS,
    }
    if case.stream:
        body["stream"] = True
    if case.include_usage:
        body["stream_options"] = {"include_usage": True}
    headers = {"authorization": f"Bearer {KEY}", ANSWER_HEADER: case.shape, **dict(case.headers)}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        url = stack.gateway + "/v1/chat/completions"
        if case.client_cut == "before_headers":
            request = asyncio.ensure_future(session.post(url, json=body, headers=headers))
            await wait_for_reservation(stack, request)
            request.cancel()  # the client leaves while the provider has said nothing
            return None
        async with session.post(url, json=body, headers=headers) as response:
            if case.client_cut == "mid_stream":
                await response.content.readline()  # the stream has started
                return None  # leaving the block closes the connection mid-stream
            try:
                return await response.read()
            except aiohttp.ClientPayloadError:
                assert case.shape.endswith("-cut")  # the provider died mid-stream
                return None


async def wait_for_reservation(stack: Stack, request: asyncio.Future[Any]) -> None:
    """Until the routing stage reserved for the request (it is then with the provider)."""
    before = counters(stack)["reserved"]
    deadline = time.monotonic() + REPORT_WAIT_S
    while counters(stack)["reserved"] == before:
        assert not request.done(), request
        assert time.monotonic() < deadline, "the request was never admitted"
        await asyncio.sleep(0.05)


def reports(values: dict[str, float]) -> float:
    return sum(values[source] for source in SOURCES)


@pytest.mark.parametrize("name", CASES)
def test_each_answer_shape_is_charged_once_by_the_rule(stack: Stack, name: str) -> None:
    case = CASES[name]
    before = counters(stack)
    received = asyncio.run(send(stack, case))
    if case.client_sees_usage is not None:
        assert received is not None and received.rstrip().endswith(b"data: [DONE]"), received
        assert bool(USAGE_EVENT.search(received)) is case.client_sees_usage, received
        assert received.count(b"data: ") == CONTENT_CHUNKS + 1 + case.client_sees_usage
    deadline = time.monotonic() + REPORT_WAIT_S
    while reports(counters(stack)) == reports(before):
        assert time.monotonic() < deadline, f"{name}: no usage report"
        time.sleep(0.05)
    time.sleep(SETTLE_S)  # room for a second report, which must not come
    after = counters(stack)
    delta = {key: after[key] - before[key] for key in after}
    assert reports(delta) == 1, f"{name}: reported {reports(delta):g} times: {delta}"
    assert delta[case.source] == 1, f"{name}: {delta}"
    estimate_input = delta["reserved"] - MAX_TOKENS
    assert estimate_input > 0
    expected: tuple[float, float] | None = {
        "usage": (PROMPT_TOKENS, COMPLETION_TOKENS),
        "estimate": (estimate_input, MAX_TOKENS),
        "nothing": (0, 0),
    }.get(case.charged)
    if expected is None:  # counted:<n>[-<m>]: the prompt estimate and a token per chunk
        low, _, high = case.charged.partition(":")[2].partition("-")
        chunks = delta["output"] if int(low) <= delta["output"] <= int(high or low) else -1
        expected = (estimate_input, chunks)
    assert (delta["input"], delta["output"]) == expected, f"{name}: {delta}"


def test_every_admitted_request_was_charged_once_in_all(stack: Stack) -> None:
    """After the matrix, reports equal requests."""
    time.sleep(SETTLE_S)
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    admitted = sum(
        float(value)
        for value in re.findall(
            r'sluicegate_admission_decisions_total\{outcome="admitted",[^}]*\} (\S+)', text
        )
    )
    assert admitted >= len(CASES)
    assert reports(counters(stack)) == admitted, json.dumps(counters(stack))
