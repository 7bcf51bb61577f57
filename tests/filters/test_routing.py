"""Routing stage over a real gRPC stream: the body's model picks the route."""

from __future__ import annotations

import json

import grpc
import pytest

from sluicegate import wire
from sluicegate.filters import ExtProcServer, RouteInfo, RoutingTable

from .admission_helpers import HEAD, model_of
from .helpers import (
    body_message,
    error_of,
    exchange,
    headers_message,
    routed_model,
    set_headers,
    streamed,
)

ROUTING = wire.STAGE_ROUTING


async def route(channel: grpc.aio.Channel, body: bytes) -> object:
    headers_answer, body_answer = await exchange(
        channel, ROUTING, headers_message(content_length=len(body)), body_message(body)
    )
    assert headers_answer.WhichOneof("response") == "request_headers"
    assert not headers_answer.request_headers.response.HasField("header_mutation")
    return body_answer


async def test_valid_body_routes_on_model(channel: grpc.aio.Channel, ext_proc: ExtProcServer):
    body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    answer = await route(channel, body.encode())
    assert routed_model(answer) == "gpt-4o"
    assert ext_proc.counters.get(ROUTING, "routed") == 1


async def test_whitespace_and_key_order_do_not_matter(channel: grpc.aio.Channel):
    body = b' \n{ "stream" : true ,\t"model"\r\n: "llama-3-70b" }\n'
    answer = await route(channel, body)
    assert routed_model(answer) == "llama-3-70b"
    assert streamed(answer)


async def test_only_a_streamed_request_goes_to_the_stream_twin(channel: grpc.aio.Channel) -> None:
    """`"stream": true` selects the route's stream twin (timeouts.first_token); false,
    null or absent keep the plain route (first_byte); anything else is a 400."""
    for body, stream in (
        (b'{"model": "llama-3-70b", "stream": true}', True),
        (b'{"model": "llama-3-70b", "stream": false}', False),
        (b'{"model": "llama-3-70b", "stream": null}', False),
        (b'{"model": "llama-3-70b"}', False),
    ):
        answer = await route(channel, body)
        assert routed_model(answer) == "llama-3-70b"
        assert streamed(answer) is stream, body
    error = await route(channel, b'{"model": "llama-3-70b", "stream": "yes"}')
    assert error_of(error)[0] == 400


async def test_unicode_model_is_sent_as_utf8(channel: grpc.aio.Channel):
    answer = await route(channel, json.dumps({"model": "модель-1"}).encode())
    assert routed_model(answer) == "модель-1"
    escaped = b'{"model": "\\u043c\\u043e\\u0434\\u0435\\u043b\\u044c-1"}'
    assert routed_model(await route(channel, escaped)) == "модель-1"


async def test_model_with_slash_and_colon(channel: grpc.aio.Channel):
    assert routed_model(await route(channel, b'{"model":"team/model:v1"}')) == "team/model:v1"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "invalid_json"),
        (b"not json", "invalid_json"),
        (b'{"model": "gpt-4o"', "invalid_json"),
        (b'{"model": "gpt-4o"} trailing', "invalid_json"),
        (b'{"model": "gpt-4o",}', "invalid_json"),
        (b"\xff\xfe{}", "invalid_json"),
        ('{"model": "gpt-4o"}'.encode("utf-16"), "invalid_json"),
        (b"[1, 2]", "invalid_body"),
        (b'"gpt-4o"', "invalid_body"),
        (b"null", "invalid_body"),
    ],
)
async def test_not_a_json_object_is_400(channel: grpc.aio.Channel, body: bytes, code: str):
    status, error = error_of(await route(channel, body))
    assert status == 400
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] is None


@pytest.mark.parametrize("body", [b"{}", b'{"messages": []}', b'{"model": ""}'])
async def test_missing_model_is_400(channel: grpc.aio.Channel, body: bytes):
    status, error = error_of(await route(channel, body))
    assert (status, error["code"], error["param"]) == (400, "missing_model", "model")


@pytest.mark.parametrize("value", ["1", "null", "true", '["gpt-4o"]', '{"id": "gpt-4o"}', "1.5"])
async def test_non_string_model_is_400(channel: grpc.aio.Channel, value: str):
    status, error = error_of(await route(channel, f'{{"model": {value}}}'.encode()))
    assert (status, error["code"], error["param"]) == (400, "invalid_type", "model")


async def test_duplicate_model_is_400(channel: grpc.aio.Channel):
    status, error = error_of(await route(channel, b'{"model": "gpt-4o", "model": "other"}'))
    assert (status, error["code"], error["param"]) == (400, "duplicate_parameter", "model")


async def test_duplicate_stream_is_400_naming_stream(channel: grpc.aio.Channel):
    status, error = error_of(
        await route(channel, b'{"model": "gpt-4o", "stream": true, "stream": false}')
    )
    assert (status, error["code"], error["param"]) == (400, "duplicate_parameter", "stream")


@pytest.mark.parametrize("member", ["n", "max_tokens", "logprobs", "stream_options"])
async def test_a_repeated_parameter_routing_does_not_check_is_left_to_the_provider(
    channel: grpc.aio.Channel, member: str
):
    """Without admission only `model` and `stream` are checked; the members read to choose
    the usage reader are not, so a repeated one is routed, and the stream sent as written
    (its usage not asked for: which of the two would the provider read?)."""
    body = f'{{"model": "gpt-4o", "stream": true, "{member}": 1, "{member}": 2}}'.encode()
    answer = await route(channel, body)
    assert routed_model(answer) == "gpt-4o"
    assert set_headers(answer.request_body.response)[wire.USAGE_HEADER] == b"stream"
    assert not answer.request_body.response.HasField("body_mutation")


async def test_nested_model_key_is_not_the_model(channel: grpc.aio.Channel):
    body = b'{"metadata": {"model": "gpt-4o"}}'
    status, error = error_of(await route(channel, body))
    assert (status, error["code"]) == (400, "missing_model")


async def test_unknown_model_is_404(channel: grpc.aio.Channel, ext_proc: ExtProcServer):
    status, error = error_of(await route(channel, b'{"model": "gpt-5-ultra"}'))
    assert status == 404
    assert error == {
        "message": "The model `gpt-5-ultra` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert ext_proc.counters.get(ROUTING, "model_not_found") == 1


async def test_huge_unknown_model_name_is_shortened(channel: grpc.aio.Channel):
    status, error = error_of(await route(channel, json.dumps({"model": "x" * 100_000}).encode()))
    assert status == 404
    assert len(error["message"]) < 400


async def test_deeply_nested_json_is_400_and_the_server_goes_on(channel: grpc.aio.Channel):
    body = b'{"model": "gpt-4o", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    status, error = error_of(await route(channel, body))
    assert (status, error["code"]) == (400, "invalid_json")
    assert routed_model(await route(channel, b'{"model": "gpt-4o"}')) == "gpt-4o"


async def test_huge_number_is_400(channel: grpc.aio.Channel):
    status, error = error_of(
        await route(channel, b'{"model": "gpt-4o", "n": ' + b"9" * 5000 + b"}")
    )
    assert (status, error["code"]) == (400, "invalid_json")


async def test_big_body_routes(channel: grpc.aio.Channel):
    messages = [{"role": "user", "content": "ü" * 1000}] * 5000  # ~10 MB
    body = json.dumps({"messages": messages, "model": "gpt-4o"}, ensure_ascii=False).encode()
    assert len(body) > 8 * 1024 * 1024
    assert routed_model(await route(channel, body)) == "gpt-4o"


async def test_bodiless_request_drops_client_model_header(
    channel: grpc.aio.Channel, ext_proc: ExtProcServer
):
    spoofed = headers_message(end_of_stream=True, extra=[(wire.MODEL_HEADER, "gpt-4o")])
    (answer,) = await exchange(channel, ROUTING, spoofed)
    common = answer.request_headers.response
    assert list(common.header_mutation.remove_headers) == [wire.MODEL_HEADER]
    assert not common.header_mutation.set_headers
    assert common.clear_route_cache
    assert ext_proc.counters.get(ROUTING, "no_body") == 1


async def test_body_model_overrides_client_model_header(channel: grpc.aio.Channel):
    body = b'{"model": "gpt-4o"}'
    spoofed = headers_message(extra=[(wire.MODEL_HEADER, "llama-3-70b")])
    _, answer = await exchange(channel, ROUTING, spoofed, body_message(body))
    assert routed_model(answer) == "gpt-4o"


async def test_many_requests_on_separate_streams(channel: grpc.aio.Channel):
    for index in range(20):
        model = "gpt-4o" if index % 2 else "llama-3-70b"
        assert routed_model(await route(channel, json.dumps({"model": model}).encode())) == model


async def test_response_side_messages_pass_through(channel: grpc.aio.Channel):
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    answers = await exchange(
        channel,
        ROUTING,
        ep.ProcessingRequest(response_headers=ep.HttpHeaders()),
        ep.ProcessingRequest(response_body=ep.HttpBody(body=b"x")),
        ep.ProcessingRequest(request_trailers=ep.HttpTrailers()),
    )
    kinds = [answer.WhichOneof("response") for answer in answers]
    assert kinds == ["response_headers", "response_body", "request_trailers"]
    assert all(not answer.HasField("immediate_response") for answer in answers)


async def test_hot_reload_swaps_the_table(channel: grpc.aio.Channel, ext_proc: ExtProcServer):
    body = b'{"model": "new-model"}'
    status, _ = error_of(await route(channel, body))
    assert status == 404
    ext_proc.update_table(RoutingTable({"new-model": RouteInfo("fresh")}))
    assert routed_model(await route(channel, body)) == "new-model"
    status, _ = error_of(await route(channel, b'{"model": "gpt-4o"}'))
    assert status == 404


@pytest.mark.parametrize("stage", [None, "bogus"])
async def test_unknown_stage_is_500_server_error(channel: grpc.aio.Channel, stage: str | None):
    (answer,) = await exchange(channel, stage, body_message(b'{"model": "gpt-4o"}'))
    status, error = error_of(answer)
    assert (status, error["type"], error["code"]) == (500, "server_error", "ext_proc_misconfigured")


async def test_internal_bug_is_500_and_the_stream_goes_on(
    channel: grpc.aio.Channel, ext_proc: ExtProcServer, monkeypatch: pytest.MonkeyPatch
):
    from sluicegate.filters.admission import stream

    def broken(*args: object) -> bytes:
        raise RuntimeError("bug")

    monkeypatch.setattr(stream, "read_body", broken)
    answers = await exchange(
        channel, ROUTING, body_message(b'{"model": "gpt-4o"}'), headers_message()
    )
    status, error = error_of(answers[0])
    assert (status, error["type"]) == (500, "server_error")
    assert answers[1].WhichOneof("response") == "request_headers"
    assert ext_proc.counters.get(ROUTING, "internal_error") == 1


def test_table_from_model_first_route_wins():
    table = RoutingTable.from_model(
        model_of(
            HEAD
            + """\
routes:
  - {name: a, models: [m1, m2], backends: [{provider: alpha}]}
  - {name: b, models: [m2], path_prefix: /b, backends: [{provider: alpha}]}
"""
        )
    )
    assert table.get("m2") == RouteInfo("a", "/v1/")
    assert table.route_for("m2", "/b/chat/completions") == RouteInfo("b", "/b/")
    assert table.route_for("m2", "/elsewhere") == RouteInfo("a", "/v1/")
    assert set(table) == {"m1", "m2"} and len(table) == 2 and "m1" in table
    assert table.routed_answer("m3") is None


def test_table_rejects_model_names_unfit_for_a_header():
    with pytest.raises(ValueError, match="header"):
        RoutingTable({"bad\nname": RouteInfo("r")})


def test_routed_answer_sets_only_the_model_header():
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    answer = ep.ProcessingResponse.FromString(TABLE_ANSWER)
    assert set_headers(answer.request_body.response) == {wire.MODEL_HEADER: b"gpt-4o"}


TABLE_ANSWER = RoutingTable({"gpt-4o": RouteInfo("chat")}).routed_answer("gpt-4o") or b""
