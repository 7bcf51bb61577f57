"""Routing without Python (docs/fast-lane.md): `sluicegate up` on the quickstart without
tenants or gates and with `admission.lane` left out, which makes it Envoy's (the default
lane: `auto`, without tenants Envoy's routing alone), requests through a real Envoy.

Envoy reads the model itself: no request opens a stream to the routing stage's cluster
(Envoy's own upstream request count for it stays 0), answers and errors are OpenAI's,
and every request still reaches /metrics through its record.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluicegate import wire
from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import Stack, running_stack

pytestmark = pytest.mark.e2e

DURATION = "gen_ai_server_request_duration_seconds_count"
TOKENS = "gen_ai_client_token_usage_total"
REQUESTS = "sluicegate_requests_total"
HELLO = [{"role": "user", "content": "hi"}]
# A model whose route renames nothing and shares one URL prefix: no attempt stage either.
MODEL = "qwen-plus"
# Another such model, for the test that counts its requests' records one by one.
USAGE_MODEL = "deepseek-chat"


def fast_lane_quickstart(tmp: Path) -> dict[str, Any]:
    """The quickstart with nothing to admit (no tenants, no gate) and no lane written."""
    doc = quickstart_on_free_ports(tmp)
    doc.pop("tenants")
    for route in doc["routes"]:
        route.pop("concurrency", None)
    doc["admission"].pop("lane")
    doc["admission"].pop("auto_lane")
    doc["scenarios"] = ["long-generation"]  # a client may ask for it in either lane
    return doc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("fast_lane_routing")
    with running_stack(tmp_path, fast_lane_quickstart(tmp_path)) as running:
        yield running


def _post(
    stack: Stack, body: bytes, path: str = "/v1/chat/completions", **headers: str
) -> tuple[int, str, str]:
    """(status, content-type, body)."""
    request = urllib.request.Request(
        stack.gateway + path, data=body, headers={"content-type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.headers["content-type"], response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["content-type"], err.read().decode()


def _error_count(stack: Stack, code: str) -> float:
    """Requests /metrics counts with error code `code`."""
    return stack.metric_sum(REQUESTS, error_code=code)


def _chat(stream: bool = False) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return json.dumps(body).encode()


def test_requests_are_routed_by_envoy_alone(stack: Stack) -> None:
    status, media, text = _post(stack, _chat())
    assert status == 200, text
    assert media.startswith("application/json")
    assert json.loads(text)["choices"][0]["message"]["content"]
    status, media, text = _post(stack, _chat(stream=True))
    assert status == 200, text
    assert media.startswith("text/event-stream")
    assert text.rstrip().endswith("data: [DONE]")
    assert stack.routing_stage_streams() == 0


def test_the_record_of_a_refusal_names_its_code(stack: Stack) -> None:
    """What the client was told is what /metrics counts, for each kind of refusal. Before
    the tests below refuse more (their records would come in late and count here)."""
    bodies = {
        "invalid_json": b"not json",
        "invalid_body": b"[1]",
        "missing_model": b'{"messages": []}',
        "invalid_type": b'{"model": 5}',
        "duplicate_parameter": b'{"model": "a", "model": "b"}',
        "model_not_found": b'{"model": "no-such-model"}',
    }
    before = {code: _error_count(stack, code) for code in bodies}
    for body in bodies.values():
        assert _post(stack, body)[0] in (400, 404)
    deadline = time.monotonic() + 15
    after = {code: _error_count(stack, code) for code in bodies}
    while any(after[c] == before[c] for c in bodies) and time.monotonic() < deadline:
        time.sleep(0.1)
        after = {code: _error_count(stack, code) for code in bodies}
    assert after == {code: before[code] + 1 for code in bodies}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"model": "qwen-plus", "messages": [', 400, "invalid_json"),
        (b"not json at all", 400, "invalid_json"),
        (b'{"model": "qwen-plus"} and more', 400, "invalid_json"),
        (b'{"mod\\u0065l": "qwen-plus"}', 400, "invalid_json"),  # a second `model`
        (b"[1, 2]", 400, "invalid_body"),
        (b'{"messages": []}', 400, "missing_model"),
        (b'{"model": ""}', 400, "missing_model"),
        (b"[1, 2}", 400, "invalid_json"),  # brackets of two kinds
        (b"01", 400, "invalid_json"),
        (b"-1.5e3", 400, "invalid_body"),
        (b'{"model": 5, "messages": []}', 400, "invalid_type"),
        (b'{"model": "qwen-plus", "stream": "yes"}', 400, "invalid_type"),
        (b'{"model": "qwen-plus", "model": "deepseek-chat"}', 400, "duplicate_parameter"),
        (b'{"model": "qwen-plus", "stream": true, "stream": false}', 400, "duplicate_parameter"),
        # another member repeated first does not hide a repeated `model`
        (
            b'{"n": 1, "n": 1, "model": "qwen-plus", "model": "deepseek-chat"}',
            400,
            "duplicate_parameter",
        ),
        # Any member the gateway reads, repeated: a provider would read the last one, the
        # charge the first (a cap of 1, then 100,000).
        (b'{"model": "qwen-plus", "max_tokens": 1, "max_tokens": 100000}', 400,
         "duplicate_parameter"),
        (b'{"model": "qwen-plus", "messages": [], "messages": []}', 400, "duplicate_parameter"),
        # An output cap or `n` out of the routing stage's range: the charge is read from it.
        (b'{"model": "qwen-plus", "max_tokens": -5}', 400, "invalid_value"),
        (b'{"model": "qwen-plus", "max_tokens": 1e5}', 400, "invalid_value"),
        (b'{"model": "qwen-plus", "max_completion_tokens": 0}', 400, "invalid_value"),
        (b'{"model": "qwen-plus", "max_tokens": 1000001}', 400, "invalid_value"),
        (b'{"model": "qwen-plus", "n": 129}', 400, "invalid_value"),
        # Go's encoding/json would read `Model` as `model`, `Messages` as `messages`
        (b'{"model": "qwen-plus", "Model": "deepseek-chat"}', 400, "invalid_json"),
        (b'{"model": "qwen-plus", "Messages": []}', 400, "invalid_json"),
        (b'{"model": "qwen-plus", "mod\xc3\xa9l": 1}', 400, "invalid_json"),
        (b'{"model": "no-such-model", "messages": []}', 404, "model_not_found"),
        # `model` inside another member is not the request's model
        (b'{"metadata": {"model": "qwen-plus"}, "x": "\\"model\\": 1"}', 400, "missing_model"),
    ],
)
def test_a_body_envoy_cannot_route_is_answered_in_openai_json(
    stack: Stack, body: bytes, status: int, code: str
) -> None:
    answered, media, text = _post(stack, body)
    assert (answered, media) == (status, "application/json"), text
    error = json.loads(text)["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert stack.routing_stage_streams() == 0


def test_requests_without_a_body_are_routed_by_their_path(stack: Stack) -> None:
    """As the routing stage leaves them: a listing answered, another path 404."""
    with urllib.request.urlopen(stack.gateway + "/v1/models", timeout=10) as response:
        assert response.status == 200
    assert _post(stack, b"")[0] == 404
    assert stack.routing_stage_streams() == 0


def test_a_null_stream_is_not_a_stream(stack: Stack) -> None:
    body = json.dumps({"model": MODEL, "messages": HELLO, "stream": None}).encode()
    status, media, text = _post(stack, body)
    assert (status, media.split(";")[0]) == (200, "application/json"), text


def test_every_request_still_reaches_the_metrics(stack: Stack) -> None:
    """The record carries the model and route Envoy read: /metrics counts them, under the
    scenario the client asked for when it is declared (in any case), else the route's."""
    expected = {"default": 3, "long-generation": 2}

    def counted() -> dict[str, float]:
        return {
            scenario: stack.metric_sum(DURATION, model=MODEL, route="qwen", scenario=scenario)
            - before.get(scenario, 0)
            for scenario in expected
        }

    # Earlier tests' records may still come in (Envoy sends them every 100 ms): counted
    # from when the counts hold still.
    before: dict[str, float] = {}
    before = counted()
    settled = time.monotonic() + 15
    time.sleep(0.5)
    while counted() != {scenario: 0 for scenario in expected}:
        assert time.monotonic() < settled, "earlier records never stopped coming"
        before = {k: v + before.get(k, 0) for k, v in counted().items()}
        time.sleep(0.5)
    asked = {wire.SCENARIO_HEADER: "Long-Generation"}
    for headers in ({}, {}, {wire.SCENARIO_HEADER: "not-declared"}, asked, asked):
        assert _post(stack, _chat(), **headers)[0] == 200
    deadline = time.monotonic() + 15
    while counted() != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counted() == expected


def _counts(stack: Stack) -> tuple[float, float]:
    """(requests recorded, input tokens reported) for USAGE_MODEL on /metrics."""
    requests = stack.metric_sum(DURATION, model=USAGE_MODEL)
    return requests, stack.metric_sum(TOKENS, model=USAGE_MODEL, token_type="input")


@pytest.mark.parametrize(
    ("members", "read"),
    [
        ({}, True),  # a JSON answer: json_to_metadata reads its usage
        ({"stream": True, "stream_options": {"include_usage": True}}, True),  # sse_to_metadata
        # The client did not ask: asked for it, read, and cut from its stream (below).
        ({"stream": True}, True),
        # `stream_options` without include_usage is left as written: no usage to read.
        ({"stream": True, "stream_options": {}}, False),
        ({"logprobs": True}, False),  # too long to parse in Envoy: read by nobody
        ({"max_tokens": 5000}, False),
        ({"max_tokens": 2000, "n": 3}, False),
        ({"max_tokens": 2000, "n": 2}, True),
    ],
)
def test_the_usage_reader_is_the_routing_stages(
    stack: Stack, members: dict[str, Any], read: bool
) -> None:
    """The model reader names the usage reader by the routing stage's rule: a request's
    record carries the answer's tokens exactly when that rule reads them. Only this test
    asks for USAGE_MODEL, so the counts move for its requests alone."""
    before = _counts(stack)  # every earlier request for USAGE_MODEL was waited for
    body = {"model": USAGE_MODEL, "messages": HELLO, **members}
    assert _post(stack, json.dumps(body).encode())[0] == 200
    deadline = time.monotonic() + 15
    after = _counts(stack)
    while after[0] == before[0] and time.monotonic() < deadline:
        time.sleep(0.1)
        after = _counts(stack)
    assert after[0] == before[0] + 1
    assert (after[1] > before[1]) is read, (before, after)


def test_a_stream_whose_client_did_not_ask_for_usage_gets_none(stack: Stack) -> None:
    """The usage event Envoy asked for the client is cut from what it receives (the
    stream usage filter, as in the exact lane); one it asked for itself stays."""
    plain = json.dumps({"model": MODEL, "messages": HELLO, "stream": True}).encode()
    status, _, text = _post(stack, plain)
    assert status == 200 and text.rstrip().endswith("data: [DONE]")
    assert '"usage":{' not in text.replace(" ", "")
    asked = {"model": MODEL, "messages": HELLO, "stream": True,
             "stream_options": {"include_usage": True}}  # fmt: skip
    status, _, text = _post(stack, json.dumps(asked).encode())
    assert status == 200 and '"usage":{' in text.replace(" ", "")
