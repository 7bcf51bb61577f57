"""Request records end to end: `sluicegate up` on the quickstart, requests through a real
Envoy, and the latency metrics on up's /metrics (docs/metrics.md).

Counts and labels only: the values are the benchmark's job (benchmarks/latency_metrics.py).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import Stack, running_stack

pytestmark = pytest.mark.e2e

DEMO_KEY = "sk-sluicegate-demo"
BAD_KEY = "sk-not-a-key-of-anyone"
HELLO = [{"role": "user", "content": "hello"}]
DURATION = "gen_ai_server_request_duration_seconds"
TTFT = "gen_ai_server_time_to_first_token_seconds"


def _post(stack: Stack, body: dict[str, Any], key: str = DEMO_KEY) -> int:
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            response.read()  # a stream to its end
            return int(response.status)
    except urllib.error.HTTPError as err:
        err.read()
        return err.code


def _metrics(stack: Stack) -> str:
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _samples(text: str, name: str) -> Iterator[Sample]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                yield sample


def _count_by_class(text: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for sample in _samples(text, DURATION + "_count"):
        klass = sample.labels["status_class"]
        counts[klass] = counts.get(klass, 0) + sample.value
    return counts


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("latency_metrics")
    with running_stack(tmp_path, quickstart_on_free_ports(tmp_path)) as running:
        yield running


def _wait_for(stack: Stack, done: Callable[[str], bool]) -> str:
    """/metrics once `done` holds for it: Envoy sends records every 100 ms (bounded wait)."""
    deadline = time.monotonic() + 15
    text = _metrics(stack)
    while not done(text) and time.monotonic() < deadline:
        time.sleep(0.1)
        text = _metrics(stack)
    return text


def test_every_request_is_counted_with_declared_labels(stack: Stack) -> None:
    # The stack's readiness probe (GET /v1/models without a key: 401) was a request too;
    # it was the last before the stack served, so once its record is in, all are. (This
    # test runs first on the module's stack.)
    before = _count_by_class(_wait_for(stack, lambda text: "missing_api_key" in text))
    sent = {"2xx": 0, "4xx": 0}
    for body in (
        {"model": "qwen-plus", "messages": HELLO},
        {"model": "qwen-plus", "messages": HELLO},
        {"model": "gpt-4o-mini", "messages": HELLO, "stream": True},
        {"model": "gpt-4o-mini", "messages": HELLO, "stream": True},
    ):
        assert _post(stack, body) == 200
        sent["2xx"] += 1
    assert _post(stack, {"model": "qwen-plus", "messages": HELLO}, key=BAD_KEY) == 401
    assert _post(stack, {"model": "no-such-model", "messages": HELLO}) == 404
    sent["4xx"] += 2
    expected = {k: before.get(k, 0) + sent.get(k, 0) for k in before.keys() | sent.keys()}

    text = _wait_for(stack, lambda text: _count_by_class(text) == expected)
    assert _count_by_class(text) == expected, text

    ok = [
        s.labels for s in _samples(text, DURATION + "_count") if s.labels["status_class"] == "2xx"
    ]
    assert {(labels["route"], labels["model"]) for labels in ok} == {
        ("qwen", "qwen-plus"),
        ("mini", "gpt-4o-mini"),
    }
    assert {labels["provider"] for labels in ok} <= {"alpha", "beta"}
    assert {labels["tenant"] for labels in ok} == {"demo"}
    assert {labels["priority"] for labels in ok} <= {"interactive", "none"}

    streams = list(_samples(text, TTFT + "_count"))
    assert sum(s.value for s in streams) == 2
    assert {(s.labels["route"], s.labels["model"]) for s in streams} == {("mini", "gpt-4o-mini")}
    # Their usage came from Envoy (sse_to_metadata), the event asked for them: TPOT too.
    tpot = list(_samples(text, "gen_ai_server_time_per_output_token_seconds_count"))
    assert sum(s.value for s in tpot) == 2

    refused = {
        s.labels["error_code"]: s.labels
        for s in _samples(text, "sluicegate_requests_total")
        if s.labels["status_class"] == "4xx"
    }
    assert refused.keys() == {"missing_api_key", "invalid_api_key", "model_not_found"}
    # No refusal matched a model route (Envoy's own "not-found", "models" are not routes).
    assert {labels["route"] for labels in refused.values()} == {"other"}
    assert refused["invalid_api_key"]["tenant"] == "anonymous"
    # The unknown model is a model all the same, but its name is no label.
    assert refused["model_not_found"]["model"] == "other"
    assert refused["model_not_found"]["tenant"] == "demo"
    assert "no-such-model" not in text

    for secret in (DEMO_KEY, BAD_KEY, "sha256:"):
        assert secret not in text


def _events(stack: Stack, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's events as the client receives them (`[DONE]` left out)."""
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {DEMO_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        text = response.read().decode()
    lines = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def _output_tokens(text: str) -> float:
    return sum(
        s.value
        for s in _samples(text, "gen_ai_client_token_usage_total")
        if s.labels["token_type"] == "output" and s.labels["route"] == "mini"
    )


def test_a_stream_s_usage_is_read_by_envoy_and_its_client_gets_what_it_asked(
    stack: Stack,
) -> None:
    """The routing stage asks for the usage event of a stream whose client did not; Envoy
    reads it (sse_to_metadata) and cuts it out (Lua) before the client, which gets the
    stream it asked for; a client that asked gets it. Both are counted exactly."""
    before = _output_tokens(_metrics(stack))
    stream = {"model": "gpt-4o-mini", "messages": HELLO, "stream": True}
    plain = _events(stack, stream)
    asked = _events(stack, {**stream, "stream_options": {"include_usage": True}})

    assert plain and all(event["choices"] for event in plain)
    assert all(event.get("usage") is None for event in plain)
    usage = asked[-1]["usage"]
    assert asked[-1]["choices"] == [] and usage["completion_tokens"] > 0
    assert len(asked) == len(plain) + 1

    text = _wait_for(
        stack, lambda text: _output_tokens(text) >= before + 2 * usage["completion_tokens"]
    )
    assert _output_tokens(text) == before + 2 * usage["completion_tokens"]
    envoy_log = (stack.config_path.parent / "work" / "envoy.log").read_text()
    assert "[lua]" not in envoy_log  # no script error, on any chunk


def _tpot_count(text: str) -> float:
    return sum(
        s.value
        for s in _samples(text, "gen_ai_server_time_per_output_token_seconds_count")
        if s.labels["route"] == "mini"
    )


def test_a_stream_without_usage_is_counted(stack: Stack) -> None:
    """A stream whose client set `stream_options` without `include_usage`: nobody asks
    for its usage event and the provider sends none. The native usage reader (`up`'s
    Envoy has the library) counts its events that carried text, and the metrics count
    those as its output tokens and its time per output token (docs/metrics.md)."""
    text = _metrics(stack)
    before, tpot_before = _output_tokens(text), _tpot_count(text)
    body = {"model": "gpt-4o-mini", "messages": HELLO, "stream": True, "stream_options": {}}
    events = _events(stack, body)
    assert all(event.get("usage") is None for event in events)
    texts = sum(1 for event in events for choice in event["choices"]
                if choice.get("delta", {}).get("content"))  # fmt: skip
    assert texts >= 2

    text = _wait_for(
        stack,
        lambda text: _output_tokens(text) >= before + texts and _tpot_count(text) > tpot_before,
    )
    assert _output_tokens(text) == before + texts
    assert _tpot_count(text) == tpot_before + 1
