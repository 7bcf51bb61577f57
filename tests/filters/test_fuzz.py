"""Property tests: no input crashes a stage; the body scanner agrees with json.loads."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate import wire
from sluicegate.filters import Counters, ExtProcServer
from sluicegate.filters.attempt import ROUTE_METADATA_ATTRIBUTE
from sluicegate.filters.jsonbody import BodyError, find_member
from sluicegate.filters.routing import decide

from .helpers import (
    CHANNEL_OPTIONS,
    HOST_METADATA_A,
    ROUTE_METADATA_V1,
    TABLE,
    body_message,
    error_of,
    headers_message,
    routed_model,
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
models = st.sampled_from([*TABLE, "unknown-model", ""]) | st.text(max_size=20)
request_bodies = st.dictionaries(st.text(max_size=8), json_values, max_size=5).flatmap(
    lambda base: (json_values | models).map(lambda model: {**base, "model": model})
)
# Bytes that are often near-JSON: mutate real bodies, or random bytes.
fuzzed_bytes = st.binary(max_size=300) | request_bodies.map(
    lambda doc: json.dumps(doc).encode()
).flatmap(lambda raw: st.integers(0, len(raw)).map(lambda cut: raw[:cut]))


class ThreadedServer:
    """An ExtProcServer on its own event loop thread, for synchronous hypothesis tests."""

    def __init__(self) -> None:
        self.server = ExtProcServer(TABLE)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        start = asyncio.run_coroutine_threadsafe(self.server.start("127.0.0.1:0"), self.loop)
        start.result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@pytest.fixture(scope="module")
def stub() -> Iterator[ep_grpc.ExternalProcessorStub]:
    with (
        ThreadedServer() as threaded,
        grpc.insecure_channel(threaded.server.address, options=CHANNEL_OPTIONS) as channel,
    ):
        yield ep_grpc.ExternalProcessorStub(channel)


def process(stub: ep_grpc.ExternalProcessorStub, stage: str, *requests: Any) -> list[Any]:
    metadata = ((wire.STAGE_METADATA_KEY, stage),)
    return list(stub.Process(iter(requests), metadata=metadata, timeout=10))


def assert_client_answer(answer: Any) -> None:
    """Routed, or a 4xx OpenAI error: never a 500 for anything a client can send."""
    if answer.WhichOneof("response") == "immediate_response":
        status, error = error_of(answer)
        assert status in (400, 404), error
        assert error["type"] == "invalid_request_error"
    else:
        assert routed_model(answer) in TABLE


@FUZZ
@given(body=fuzzed_bytes)
def test_routing_answers_any_body_over_grpc(stub: ep_grpc.ExternalProcessorStub, body: bytes):
    answers = process(stub, wire.STAGE_ROUTING, headers_message(), body_message(body))
    assert len(answers) == 2
    assert_client_answer(answers[1])


@FUZZ
@given(body=fuzzed_bytes)
def test_attempt_answers_any_body_over_grpc(stub: ep_grpc.ExternalProcessorStub, body: bytes):
    attributes = {
        wire.UPSTREAM_HOST_METADATA_ATTRIBUTE: HOST_METADATA_A,
        ROUTE_METADATA_ATTRIBUTE: ROUTE_METADATA_V1,
    }
    answers = process(
        stub,
        wire.STAGE_ATTEMPT,
        headers_message(content_length=len(body), attributes=attributes),
        body_message(body),
    )
    assert len(answers) == 2
    if answers[1].WhichOneof("response") == "immediate_response":
        status, _ = error_of(answers[1])
        assert status == 400
    else:
        mutation = answers[1].request_body.response.body_mutation
        if mutation.body:
            assert json.loads(mutation.body)["model"] == "a-m1"


def oracle(body: bytes) -> str:
    """What the routing decision should be, from json.loads."""
    try:
        document = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        return "400"
    if not isinstance(document, dict):
        return "400"
    model = document.get("model")
    if model is None or model == "" or not isinstance(model, str):
        return "400"
    return f"routed:{model}" if model in TABLE else "404"


@settings(max_examples=300, deadline=None)
@given(body=fuzzed_bytes | request_bodies.map(lambda doc: json.dumps(doc).encode()))
def test_routing_decision_matches_json_loads(body: bytes):
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    answer = ep.ProcessingResponse.FromString(decide(body, TABLE, Counters()))
    if answer.WhichOneof("response") == "immediate_response":
        got = str(answer.immediate_response.status.code)
    else:
        got = f"routed:{routed_model(answer)}"
    assert got == oracle(body)


whitespace = st.text(alphabet=" \t\r\n", max_size=3)


@settings(max_examples=200, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=6), json_values, max_size=6), pad=whitespace)
def test_find_member_span_holds_the_value(doc: dict[str, Any], pad: str):
    text = pad + json.dumps(doc, indent=None if pad else 1) + pad
    for key, value in doc.items():
        member = find_member(text, key)
        assert member is not None
        assert member.value == value
        assert json.loads(text[member.start : member.end]) == value
    assert find_member(text, "\x00absent") is None


@settings(max_examples=1000, deadline=None)
@given(text=st.text(max_size=60) | st.text(alphabet='{}[]":,0123456789 \\nulltrefas', max_size=40))
def test_find_member_rejects_exactly_what_json_loads_rejects(text: str):
    try:
        expected: Any = json.loads(text)
    except (ValueError, RecursionError):
        expected = BodyError
    try:
        find_member(text, "a")
        got: Any = "object"
    except BodyError as exc:
        got = BodyError if exc.problem == "json" else exc.problem
    if expected is BodyError:
        assert got is BodyError
    elif isinstance(expected, dict):
        assert got in ("object", "duplicate")
    else:
        assert got == "object"
