"""Helpers for the admission unit tests: configs, answers decoded, streams driven by hand."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from prometheus_client import CollectorRegistry

from sluicegate import wire
from sluicegate.config import Config, hash_key, load_config_text
from sluicegate.filters import ExtProcServer
from sluicegate.model import Gateway, build_model

from .helpers import CHANNEL_OPTIONS, body_message, headers_message

# A fixed salt keeps hashing cheap and the config text stable between runs.
SALT = bytes(range(16))


def hashed(key: str) -> str:
    return hash_key(key, SALT)


@asynccontextmanager
async def serving(text: str | None) -> AsyncIterator[tuple[ExtProcServer, grpc.aio.Channel]]:
    """A started server with the config's table and admission policy (None: an empty
    one), and a channel to it."""
    server = ExtProcServer()
    if text is not None:
        server.load(model_of(text))
    await server.start("127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS) as channel:
            yield server, channel
    finally:
        await server.stop(0)


def config_of(text: str) -> Config:
    """A validated Config from (dedented) YAML text."""
    return load_config_text(textwrap.dedent(text), "x.yaml")


def model_of(text: str) -> Gateway:
    """The resolved model of (dedented) YAML text, as the stack builds it (no keys)."""
    return build_model(config_of(text), {})


# The document head most tests extend: one listener, two providers.
HEAD = """\
version: 1
listeners:
  - name: gw
    port: 10000
providers:
  - name: alpha
    base_url: http://127.0.0.1:18081/v1
  - name: beta
    base_url: http://127.0.0.1:18082/v1
"""


def decode(answer: bytes) -> Any:
    return ep.ProcessingResponse.FromString(answer)


def immediate(answer: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, error object, response headers) of an immediate response."""
    assert answer.WhichOneof("response") == "immediate_response", answer
    response = answer.immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in response.headers.set_headers}
    return response.status.code, json.loads(response.body)["error"], headers


def metadata_of(answer: Any) -> dict[str, Any]:
    """The answer's dynamic metadata in the sluicegate namespace (empty when none): each
    value a str, or a float for a number (wire.META_QUEUE_MS)."""
    fields = answer.dynamic_metadata.fields
    if wire.METADATA_NAMESPACE not in fields:
        return {}
    inner = fields[wire.METADATA_NAMESPACE].struct_value.fields
    return {
        key: value.number_value if value.HasField("number_value") else value.string_value
        for key, value in inner.items()
    }


def record_of(answer: Any) -> dict[str, Any]:
    """The request record's part of the answer's metadata (admission/record.py)."""
    keys = (
        wire.META_TENANT, wire.META_KEY_NAME, wire.META_MODEL, wire.META_PRIORITY,
        wire.META_SCENARIO, wire.META_QUEUE_MS, wire.META_STREAM, wire.META_ERROR_CODE,
        wire.META_ROUTE,
    )  # fmt: skip
    return {key: value for key, value in metadata_of(answer).items() if key in keys}


def sample(
    registry: CollectorRegistry, name: str, labels: Mapping[str, str] | None = None
) -> float:
    """A metric sample's value, 0 when it was never set."""
    value = registry.get_sample_value(name, dict(labels or {}))
    return 0.0 if value is None else value


async def settle(rounds: int = 5) -> None:
    """Let tasks spawned in the background (reconcile, refund) run."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll `predicate` on the event loop until it holds (AssertionError after `timeout`)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def chat_body(
    model: str, *, max_tokens: int | None = None, content: str = "hi", stream: bool = False
) -> bytes:
    document: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": content}]}
    if max_tokens is not None:
        document["max_tokens"] = max_tokens
    if stream:
        document["stream"] = True
    return json.dumps(document, separators=(",", ":")).encode()


def prompt_estimate(content: str = "hi") -> int:
    """The estimate of chat_body's prompt: the raw `messages` JSON, 4 ASCII chars a token."""
    text = json.dumps([{"role": "user", "content": content}], separators=(",", ":"))
    assert text.isascii()
    return -(-len(text) // 4)


class Stream:
    """One routing-stage Process stream driven message by message (like Envoy does)."""

    def __init__(self, channel: grpc.aio.Channel, stage: str = wire.STAGE_ROUTING) -> None:
        stub = ep_grpc.ExternalProcessorStub(channel)
        self.call = stub.Process(metadata=((wire.STAGE_METADATA_KEY, stage),), timeout=10)
        self.overrides: list[Any] = []  # override_message_timeout values received

    async def send(self, request: Any) -> Any:
        await self.call.write(request)
        return await self.read_answer()

    async def read_answer(self) -> Any:
        """The next answer, past any message that only extends Envoy's timeout (sent
        before a request waits at a gate)."""
        while True:
            message = await self.call.read()
            if message.WhichOneof("response") is not None or message.HasField("dynamic_metadata"):
                return message
            assert message.HasField("override_message_timeout"), message
            self.overrides.append(message.override_message_timeout.ToTimedelta())

    async def headers(
        self,
        key: str | None = None,
        extra: Sequence[tuple[str, str]] = (),
        path: str = "/v1/chat/completions",
        method: str = "POST",
    ) -> Any:
        """The request headers; a GET has no body (end_of_stream), as Envoy sends it."""
        pairs = list(extra)
        if key is not None:
            pairs.append(("authorization", f"Bearer {key}"))
        message = headers_message(path, extra=pairs, method=method, end_of_stream=method == "GET")
        return await self.send(message)

    async def body(self, body: bytes) -> Any:
        return await self.send(body_message(body))

    async def write_body(self, body: bytes) -> None:
        """Send the body without waiting for the answer (it may be queued)."""
        await self.call.write(body_message(body))

    async def close(self) -> None:
        """The request is over: the client half-closes and the server ends the stream."""
        await self.call.done_writing()
        assert await self.call.code() == grpc.StatusCode.OK

    def cancel(self) -> None:
        self.call.cancel()
