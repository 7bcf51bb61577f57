"""Building and sending answers: JSON bodies, SSE streams, and cut-off variants of both."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, NoReturn

from aiohttp import web

from sluicegate.provider import generation, sse
from sluicegate.provider.faults import Fault, Overrides, abort_connection
from sluicegate.provider.settings import MockProviderSettings


class Kind(Enum):
    CHAT = "chat"
    TEXT = "text"
    MODELS = "models"


@dataclass(frozen=True)
class Plan:
    """What to generate for one accepted request."""

    model: str
    stream: bool
    include_usage: bool
    tokens: int
    finish_reason: str
    prompt_tokens: int
    fault: Fault
    overrides: Overrides


def client_gone() -> NoReturn:
    # aiohttp treats a cancelled handler as "client went away" and logs nothing; any other
    # exception would be logged as a server error and answered with a 500 it cannot send.
    raise asyncio.CancelledError


def _completion_id(kind: Kind) -> str:
    prefix = "chatcmpl" if kind is Kind.CHAT else "cmpl"
    return f"{prefix}-mock{uuid.uuid4().hex[:24]}"


def completion_payload(kind: Kind, plan: Plan) -> dict[str, Any]:
    text = generation.completion_text(plan.tokens)
    choice: dict[str, Any]
    if kind is Kind.CHAT:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": None,
            "finish_reason": plan.finish_reason,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": plan.finish_reason}
    return {
        "id": _completion_id(kind),
        "object": "chat.completion" if kind is Kind.CHAT else "text_completion",
        "created": int(time.time()),
        "model": plan.model,
        "system_fingerprint": "fp_mock",
        "choices": [choice],
        "usage": generation.usage(plan.prompt_tokens, plan.tokens),
    }


def models_payload(settings: MockProviderSettings) -> dict[str, Any]:
    created = 1_700_000_000  # fixed: listing the same models twice should be identical
    return {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "created": created, "owned_by": settings.name}
            for model in settings.models
        ],
    }


def ratelimit_headers(*, remaining: int, reset: str) -> dict[str, str]:
    # Plausible values so a gateway that reads them has something well-formed to parse.
    return {
        "x-ratelimit-limit-requests": "10000",
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": reset,
        "x-ratelimit-limit-tokens": "2000000",
        "x-ratelimit-remaining-tokens": str(remaining * 200),
        "x-ratelimit-reset-tokens": reset,
    }


def _response_headers(request: web.Request, started: float) -> dict[str, str]:
    return {
        "x-request-id": request.headers.get("x-request-id") or f"req_{uuid.uuid4().hex}",
        "openai-processing-ms": str(int((time.monotonic() - started) * 1000)),
        **ratelimit_headers(remaining=9999, reset="6ms"),
    }


# What a misbehaving provider sends (Fault.GARBAGE): a data line that is not JSON, one
# that is not UTF-8, a comment, and an event split oddly, between good events.
GARBAGE_EVENTS: Final = (
    b"data: {this is not json\n\n"
    b"data: \xff\xfe\xfd\n\n"
    b": keep-alive comment\n\n"
    b"event: weird\ndata: [1, 2,\n\n"
)
GARBAGE_JSON: Final = b'{"id": "chatcmpl-broken", "choices": [{"message": {"content": "tru'


def garbage_answer(request: web.Request, started: float) -> web.Response:
    """A 200 whose JSON body does not parse (Fault.GARBAGE, not streamed)."""
    return web.Response(
        body=GARBAGE_JSON,
        content_type="application/json",
        headers=_response_headers(request, started),
    )


def json_answer(payload: Any, request: web.Request, started: float) -> web.Response:
    return web.Response(
        body=sse.dumps(payload).encode(),
        content_type="application/json",
        headers=_response_headers(request, started),
    )


async def cut_body(request: web.Request, payload: Any) -> NoReturn:
    """Announce the full body, send half of it, then drop the connection."""
    body = sse.dumps(payload).encode()
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(body)
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        await response.write(body[: len(body) // 2])
    abort_connection(request.transport)
    client_gone()


async def stream(
    request: web.Request,
    settings: MockProviderSettings,
    kind: Kind,
    plan: Plan,
    pacer: generation.Pacer,
    started: float,
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            **_response_headers(request, started),
        }
    )
    encoder = sse.ChunkEncoder(
        completion_id=_completion_id(kind),
        object_type="chat.completion.chunk" if kind is Kind.CHAT else "text_completion",
        created=int(time.time()),
        model=plan.model,
        include_usage=plan.include_usage,
    )
    # A cut stream still delivers some content first, so the client has seen a first token
    # (and a gateway can no longer retry transparently) before the connection dies.
    cut_after = max(1, plan.tokens // 2) if plan.fault is Fault.CUT else None
    try:
        if settings.early_headers:
            await response.prepare(request)
        for index in range(1, plan.tokens + 1):
            await pacer.next_token()
            if not response.prepared:
                # StreamResponse sends its headers on prepare(): with the first token, like
                # OpenAI, unless early_headers asked for them up front.
                await response.prepare(request)
            await response.write(encoder.choices([_token_choice(kind, index)]))
            if plan.fault is Fault.GARBAGE and index == max(1, plan.tokens // 2):
                await response.write(GARBAGE_EVENTS)
            if cut_after is not None and index >= cut_after:
                abort_connection(request.transport)
                client_gone()
        if plan.overrides.end_pause_ms:
            # Apart from the last token, so a client can time the stream's end alone.
            await asyncio.sleep(plan.overrides.end_pause_ms / 1000)
        await response.write(encoder.choices([_final_choice(kind, plan.finish_reason)]))
        if plan.include_usage and plan.fault is not Fault.GARBAGE:
            await response.write(encoder.usage(generation.usage(plan.prompt_tokens, plan.tokens)))
        await response.write(sse.DONE)
        await response.write_eof()
    except ConnectionError:
        client_gone()
    return response


def _token_choice(kind: Kind, index: int) -> dict[str, Any]:
    text = generation.token_text(index)
    if kind is Kind.TEXT:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    delta = {"role": "assistant", "content": text} if index == 1 else {"content": text}
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}


def _final_choice(kind: Kind, finish_reason: str) -> dict[str, Any]:
    if kind is Kind.TEXT:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}
    return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}
