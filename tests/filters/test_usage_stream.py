"""The usage stage: real usage read off a response reconciles the reservation made at
admission, in a real MemoryStore, and is counted in the admission metrics."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from sluicegate import wire
from sluicegate.filters import ExtProcServer
from sluicegate.filters.admission import AdmissionController, UsageStream
from sluicegate.filters.limiter import Limit, LimiterStore, Usage

from .admission_helpers import Stream, sample, serving, settle, wait_until

LIMITS = (
    Limit("tenant", "acme", "tokens", 1_000_000, 60.0),
    Limit("tenant", "acme", "input_tokens", 1_000_000, 60.0),
    Limit("tenant", "acme", "output_tokens", 1_000_000, 60.0),
)
ESTIMATE = Usage(40, 200)
RESERVATION = "rid-1"
_probes = itertools.count()


def metadata(reservation: str | None = RESERVATION, estimate: Usage = ESTIMATE) -> dict[str, str]:
    """A reservation the routing stage left to the observer (wire.META_USAGE_VIA)."""
    values = {
        wire.META_USAGE_VIA: wire.USAGE_VIA_OBSERVER,
        wire.META_TENANT: "acme",
        wire.META_MODEL: "gpt-4o",
        wire.META_ESTIMATE_INPUT: str(estimate.input_tokens),
        wire.META_ESTIMATE_OUTPUT: str(estimate.output_tokens),
    }
    if reservation is not None:
        values[wire.META_RESERVATION] = reservation
    return values


def response_headers(
    status: str = "200",
    content_type: str | None = "application/json",
    *,
    values: dict[str, str] | None = None,
    end_of_stream: bool = False,
) -> Any:
    request = ep.ProcessingRequest(observability_mode=True)
    headers = request.response_headers.headers.headers
    headers.add(key=":status", raw_value=status.encode())
    if content_type is not None:
        headers.add(key="content-type", raw_value=content_type.encode())
    request.response_headers.end_of_stream = end_of_stream
    if values is not None:
        namespace = request.metadata_context.filter_metadata[wire.METADATA_NAMESPACE]
        for key, value in values.items():
            namespace.fields[key].string_value = value
    return request


def response_body(chunk: bytes, *, end_of_stream: bool = False) -> Any:
    return ep.ProcessingRequest(
        response_body=ep.HttpBody(body=chunk, end_of_stream=end_of_stream),
        observability_mode=True,
    )


def sse(*events: dict[str, Any], done: bool = True) -> bytes:
    text = "".join(f"data: {json.dumps(event)}\n\n" for event in events)
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


def delta(content: str) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}}],
    }


def usage_doc(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@pytest.fixture
async def controller() -> AsyncIterator[AdmissionController]:
    controller = AdmissionController()  # the default policy: an in-process MemoryStore
    await controller.store().reserve(RESERVATION, LIMITS, ESTIMATE)
    yield controller
    await controller.close()


async def charged(store: LimiterStore) -> tuple[int, int, int]:
    """(tokens, input, output) now charged on LIMITS: read by a zero-token reservation."""
    decision = await store.reserve(f"probe-{next(_probes)}", LIMITS, Usage(0, 0))
    tokens, inputs, outputs = (state.used for state in decision.states)
    return tokens, inputs, outputs


def metric(controller: AdmissionController, name: str, **labels: str) -> float:
    return sample(controller.metrics.registry, name, labels)


def reports(controller: AdmissionController, source: str) -> float:
    return metric(controller, "sluicegate_usage_reports_total", source=source)


def tokens(controller: AdmissionController) -> tuple[float, float, float]:
    """(input charged, output charged, refunded) in the metrics for acme / gpt-4o."""
    labels = {"tenant": "acme", "model": "gpt-4o"}
    return (
        metric(controller, "sluicegate_tokens_charged_total", type="input", **labels),
        metric(controller, "sluicegate_tokens_charged_total", type="output", **labels),
        metric(controller, "sluicegate_tokens_refunded_total", **labels),
    )


async def run(controller: AdmissionController, *messages: Any, finish: bool = False) -> UsageStream:
    stream = UsageStream(controller)
    for message in messages:
        stream.on_message(message)
    if finish:
        stream.finish()
    await settle()
    return stream


async def test_reservation_is_charged_its_estimate_before_any_response(
    controller: AdmissionController,
) -> None:
    assert await charged(controller.store()) == (240, 40, 200)


async def test_json_usage_reconciles_to_the_provider_numbers(
    controller: AdmissionController,
) -> None:
    body = json.dumps({"id": "x", "choices": [], "usage": usage_doc(12, 7)}).encode()
    await run(
        controller,
        response_headers(values=metadata()),
        response_body(body[:10]),
        response_body(body[10:], end_of_stream=True),
    )
    assert await charged(controller.store()) == (19, 12, 7)
    assert reports(controller, "provider") == 1
    assert tokens(controller) == (12, 7, 240 - 19)


async def test_usage_above_the_estimate_is_charged_in_full(
    controller: AdmissionController,
) -> None:
    body = json.dumps({"usage": usage_doc(100, 500)}).encode()
    await run(
        controller, response_headers(values=metadata()), response_body(body, end_of_stream=True)
    )
    assert await charged(controller.store()) == (600, 100, 500)
    assert tokens(controller) == (100, 500, 0)  # nothing refunded


async def test_sse_final_usage_chunk_is_the_charge(controller: AdmissionController) -> None:
    final = {"object": "chat.completion.chunk", "choices": [], "usage": usage_doc(31, 3)}
    stream_body = sse(delta("Hel"), delta("lo"), delta("!"), final)
    await run(
        controller,
        response_headers(content_type="text/event-stream; charset=utf-8", values=metadata()),
        response_body(stream_body[:25]),
        response_body(stream_body[25:]),
        response_body(b"", end_of_stream=True),
    )
    assert await charged(controller.store()) == (34, 31, 3)
    assert reports(controller, "provider") == 1
    assert tokens(controller) == (31, 3, 240 - 34)


async def test_sse_without_usage_charges_estimate_input_and_counted_chunks(
    controller: AdmissionController,
) -> None:
    stream_body = sse(delta("a"), delta(""), delta("b"), delta("c"))  # the empty delta: no token
    await run(
        controller,
        response_headers(content_type="text/event-stream", values=metadata()),
        response_body(stream_body, end_of_stream=True),
    )
    assert await charged(controller.store()) == (43, 40, 3)
    assert reports(controller, "counted") == 1
    assert reports(controller, "provider") == 0
    assert tokens(controller) == (40, 3, 240 - 43)


@pytest.mark.parametrize("status", ["500", "503", "429", "400"])
async def test_error_status_without_usage_is_refunded(
    controller: AdmissionController, status: str
) -> None:
    error = json.dumps({"error": {"message": "upstream down", "type": "server_error"}}).encode()
    await run(
        controller,
        response_headers(status, values=metadata()),
        response_body(error, end_of_stream=True),
    )
    assert await charged(controller.store()) == (0, 0, 0)
    assert reports(controller, "error") == 1
    assert tokens(controller) == (0, 0, 240)


async def test_error_answered_by_envoy_without_a_body_is_refunded(
    controller: AdmissionController,
) -> None:
    await run(
        controller, response_headers("503", "text/plain", values=metadata(), end_of_stream=True)
    )
    assert await charged(controller.store()) == (0, 0, 0)
    assert reports(controller, "error") == 1


async def test_cut_stream_is_charged_what_was_seen(controller: AdmissionController) -> None:
    stream_body = sse(delta("a"), delta("b"), done=False)
    stream = await run(
        controller,
        response_headers(content_type="text/event-stream", values=metadata()),
        response_body(stream_body),  # the client went away: no end_of_stream
    )
    assert await charged(controller.store()) == (240, 40, 200)  # not reconciled yet
    assert reports(controller, "counted") == 0
    stream.finish()  # the ext_proc stream ended
    await settle()
    assert await charged(controller.store()) == (42, 40, 2)
    assert reports(controller, "counted") == 1


async def test_cut_json_body_keeps_the_estimate(controller: AdmissionController) -> None:
    await run(
        controller,
        response_headers(values=metadata()),
        response_body(b'{"id": "x", "choices": [{"message": {"content": "hal'),
        finish=True,
    )
    assert await charged(controller.store()) == (240, 40, 200)
    assert reports(controller, "estimate") == 1
    assert tokens(controller) == (40, 200, 0)


async def test_json_without_usage_keeps_the_estimate(controller: AdmissionController) -> None:
    body = json.dumps({"id": "x", "choices": [{"message": {"content": "hi"}}]}).encode()
    await run(
        controller, response_headers(values=metadata()), response_body(body, end_of_stream=True)
    )
    assert await charged(controller.store()) == (240, 40, 200)
    assert reports(controller, "estimate") == 1


@pytest.mark.parametrize(
    "values",
    [None, {}, metadata(reservation=None)],
    ids=["no-metadata", "empty-namespace", "no-reservation"],
)
async def test_no_reservation_in_metadata_changes_nothing(
    controller: AdmissionController, values: dict[str, str] | None
) -> None:
    headers = response_headers(values=values)
    if values == {}:
        headers.metadata_context.filter_metadata[wire.METADATA_NAMESPACE].SetInParent()
    body = json.dumps({"usage": usage_doc(1, 1)}).encode()
    await run(controller, headers, response_body(body, end_of_stream=True), finish=True)
    assert await charged(controller.store()) == (240, 40, 200)
    for source in ("provider", "counted", "estimate", "error"):
        assert reports(controller, source) == 0
    assert tokens(controller) == (0, 0, 0)


async def test_finish_is_idempotent(controller: AdmissionController) -> None:
    body = json.dumps({"usage": usage_doc(12, 7)}).encode()
    stream = await run(
        controller, response_headers(values=metadata()), response_body(body, end_of_stream=True)
    )
    for _ in range(3):
        stream.finish()
        stream.on_message(response_body(b"more", end_of_stream=True))
    await settle()
    assert reports(controller, "provider") == 1
    assert tokens(controller) == (12, 7, 240 - 19)
    assert await charged(controller.store()) == (19, 12, 7)


async def test_finish_before_any_message_does_nothing(controller: AdmissionController) -> None:
    await run(controller, finish=True)
    assert await charged(controller.store()) == (240, 40, 200)
    assert reports(controller, "error") == 0


async def test_unknown_reservation_is_counted_but_charges_nothing(
    controller: AdmissionController,
) -> None:
    body = json.dumps({"usage": usage_doc(12, 7)}).encode()
    await run(
        controller,
        response_headers(values=metadata(reservation="rid-never-made")),
        response_body(body, end_of_stream=True),
    )
    assert await charged(controller.store()) == (240, 40, 200)
    assert reports(controller, "provider") == 1


async def test_media_type_case_does_not_change_the_charge(
    controller: AdmissionController,
) -> None:
    await run(
        controller,
        response_headers(content_type="Text/Event-Stream", values=metadata()),
        response_body(sse(delta("a"), delta("b"), done=False)),
        finish=True,
    )
    assert await charged(controller.store()) == (42, 40, 2)


# ----- the usage stage over gRPC --------------------------------------------------------


@pytest.fixture
async def usage_server() -> AsyncIterator[tuple[ExtProcServer, grpc.aio.Channel]]:
    async with serving(None) as pair:
        yield pair


async def test_usage_stage_stream_end_charges_a_cut_stream(
    usage_server: tuple[ExtProcServer, grpc.aio.Channel],
) -> None:
    server, channel = usage_server
    store = server.admission.store()
    await store.reserve(RESERVATION, LIMITS, ESTIMATE)
    stream = Stream(channel, wire.STAGE_USAGE)
    await stream.call.write(response_headers(content_type="text/event-stream", values=metadata()))
    await stream.call.write(response_body(sse(delta("a"), delta("b"), delta("c"), done=False)))
    await stream.close()  # Envoy ends the stream: the response was cut
    registry = server.admission.metrics.registry
    await wait_until(
        lambda: sample(registry, "sluicegate_usage_reports_total", {"source": "counted"}) == 1
    )
    await settle()
    assert await charged(store) == (43, 40, 3)


async def test_a_request_its_record_charges_is_not_charged_by_the_observer(
    controller: AdmissionController,
) -> None:
    """One report per request: the observer may see an answer it was not given (a local
    reply sent where the routing stage's header mutation failed), and leaves it to the
    request record."""
    values = {k: v for k, v in metadata().items() if k != wire.META_USAGE_VIA}
    body = json.dumps({"usage": usage_doc(1, 1)}).encode()
    await run(
        controller,
        response_headers("500", values=values),
        response_body(body, end_of_stream=True),
        finish=True,
    )
    assert await charged(controller.store()) == (240, 40, 200)
    for source in ("provider", "counted", "estimate", "error"):
        assert reports(controller, source) == 0


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "application/json;charset=UTF-8", "application/x+json"],
)
async def test_json_with_parameters_is_read_for_its_usage(
    controller: AdmissionController, content_type: str
) -> None:
    body = json.dumps({"usage": usage_doc(7, 3)}).encode()
    await run(
        controller,
        response_headers(content_type=content_type, values=metadata()),
        response_body(body, end_of_stream=True),
    )
    assert await charged(controller.store()) == (10, 7, 3)
    assert reports(controller, "provider") == 1
