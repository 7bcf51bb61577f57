"""Client input that used to get a 500 or no answer, over a real gRPC stream to the
routing stage (issue 9, part 3): a lone surrogate echoed in an error, more headers than
Envoy's limit leaves room for, and a declared body far above the limit."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from sluicegate import wire
from sluicegate.filters import ExtProcServer
from sluicegate.filters.responses import openai_error

from .admission_helpers import HEAD, hashed, model_of
from .helpers import body_message, error_of, exchange, headers_message

ROUTING = wire.STAGE_ROUTING
TENANTS = f"""\
routes:
  - name: chat
    models: [chat]
    backends: [{{provider: alpha}}]
tenants:
  - name: team
    keys: [{{name: k, hash: "{hashed("sk-team")}"}}]
"""


@pytest.mark.parametrize("model", ["\\ud800", "a\\udfffb", "\\udc00\\ud800"])
async def test_a_lone_surrogate_in_the_model_gets_a_404_not_a_500(
    channel: grpc.aio.Channel, model: str
) -> None:
    # JSON may escape a lone surrogate; UTF-8 cannot carry one, so the echo must not either.
    body = b'{"model": "' + model.encode() + b'", "messages": []}'
    _, answer = await exchange(
        channel, ROUTING, headers_message(content_length=len(body)), body_message(body)
    )
    status, error = error_of(answer)
    assert status == 404 and error["code"] == "model_not_found"
    assert "\ufffd" in error["message"]


def test_an_error_message_is_always_valid_utf8() -> None:
    for text in ("\ud800", "x\udcff", "ok \U0001f600 ok", "\udc80\udc80"):
        document = json.loads(openai_error(text).decode("utf-8", "strict"))
        assert document["error"]["message"].encode("utf-8")  # no surrogate left


def many_headers(count: int, value: str = "v") -> list[tuple[str, str]]:
    """`count` headers in all with the two pseudo-headers headers_message adds."""
    return [(f"x-h-{i}", value) for i in range(count - 2)]


async def headers_answer(channel: grpc.aio.Channel, *extra: tuple[str, str]) -> Any:
    (answer,) = await exchange(channel, ROUTING, headers_message(extra=extra))
    return answer


async def test_up_to_the_header_limit_passes(channel: grpc.aio.Channel) -> None:
    answer = await headers_answer(channel, *many_headers(wire.MAX_REQUEST_HEADERS))
    assert answer.WhichOneof("response") == "request_headers"


async def test_one_header_over_the_limit_is_a_431_in_openai_format(
    channel: grpc.aio.Channel,
) -> None:
    # Envoy allows the headroom above the limit, so the filter's own header mutation can
    # never push a valid request over (that was a 500 header_mutation_result_exceeds_limit).
    answer = await headers_answer(channel, *many_headers(wire.MAX_REQUEST_HEADERS + 1))
    status, error = error_of(answer)
    assert status == 431 and error["code"] == "request_headers_too_large"


async def test_headers_over_the_size_limit_are_a_431(channel: grpc.aio.Channel) -> None:
    big = "x" * 8000
    fits = [(f"x-big-{i}", big) for i in range(7)]  # 56 KB
    assert (await headers_answer(channel, *fits)).WhichOneof("response") == "request_headers"
    over = [(f"x-big-{i}", big) for i in range(8)]  # 64 KB > 60 KiB
    status, error = error_of(await headers_answer(channel, *over))
    assert status == 431 and error["code"] == "request_headers_too_large"


@pytest.mark.parametrize("admission", [False, True])
async def test_a_declared_body_over_the_limit_is_a_413_on_the_headers(admission: bool) -> None:
    """Envoy would wait for 100 MB that never come; the headers already say it is too
    much. Both routing paths: plain routing, and admission with tenants."""
    text = HEAD + "limits: {max_request_body_bytes: 2000}\n" + TENANTS
    gateway = model_of(text if admission else text.partition("tenants:")[0])
    server = ExtProcServer()
    server.load(gateway)
    await server.start("127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            key = [("authorization", "Bearer sk-whatever")]
            (answer,) = await exchange(
                channel, ROUTING, headers_message(extra=key, content_length=100_000_000)
            )
            status, error = error_of(answer)
            assert status == 413 and error["code"] == "request_too_large"
            assert "2000 bytes" in error["message"]
            (answer,) = await exchange(
                channel, ROUTING, headers_message(extra=key, content_length=2000)
            )
            # At the limit: not refused for its size (a 401 for the made-up key, or on).
            if answer.WhichOneof("response") == "immediate_response":
                assert error_of(answer)[0] == 401
    finally:
        await server.stop(0)
