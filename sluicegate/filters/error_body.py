"""The error-body stage: a provider's error answer that is not JSON, wrapped in OpenAI's
error JSON with its status and text kept.

Envoy calls this stage only for such answers (xds translate error_bodies.py: a matcher on
the response's status and content type), with the response headers and then the whole
buffered body. The answer to the headers sets the JSON content type and drops the
provider's content-length (the body changes; Envoy then sends it with its own framing);
the answer to the body replaces it. A body that is already an OpenAI error object (a
provider that mislabels its JSON) is kept as it is.
"""

from __future__ import annotations

import json
from typing import Any, Final

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from sluicegate import wire

from .counters import Counters
from .headers import header_text
from .responses import PASS_THROUGH, common, openai_error, set_header

STAGE: Final = wire.STAGE_ERROR_BODY
WRAPPED: Final = "wrapped"
# The provider's text kept in the message; longer text is cut (an HTML error page).
MAX_MESSAGE_CHARS: Final = 4096


def _headers_answer() -> bytes:
    response = common([set_header("content-type", b"application/json")])
    response.header_mutation.remove_headers.append("content-length")
    result: bytes = ep.ProcessingResponse(
        response_headers=ep.HeadersResponse(response=response)
    ).SerializeToString()
    return result


HEADERS_ANSWER: Final = _headers_answer()


def _is_openai_error(body: bytes) -> bool:
    try:
        document = json.loads(body)
    except ValueError:  # not JSON, or not UTF-8
        return False
    return isinstance(document, dict) and isinstance(document.get("error"), dict)


def wrapped_body(status: int, body: bytes) -> bytes:
    """OpenAI's error JSON for a provider's `status` answer with this body."""
    if _is_openai_error(body):
        return body
    text = body.decode("utf-8", "replace").strip()
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + "…"
    if not text:
        text = f"The provider answered {status} without a message."
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return openai_error(text, type=kind, code=wire.PROVIDER_ERROR)


class ErrorBodyStream:
    """One provider error answer (one ext_proc stream)."""

    __slots__ = ("_counters", "_status")

    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self._status = 0

    def _replaced(self, body: bytes) -> bytes:
        self._counters.inc(STAGE, WRAPPED)
        response = common(
            [set_header("content-type", b"application/json")],
            body=wrapped_body(self._status, body),
        )
        response.status = ep.CommonResponse.CONTINUE_AND_REPLACE
        response.header_mutation.remove_headers.append("content-length")
        answer: bytes = ep.ProcessingResponse(
            response_headers=ep.HeadersResponse(response=response)
        ).SerializeToString()
        return answer

    def on_message(self, request: Any) -> bytes:
        kind = request.WhichOneof("request")
        if kind == "response_headers":
            for header in request.response_headers.headers.headers:
                if header.key == ":status":
                    text = header_text(header)
                    self._status = int(text) if text.isdigit() else 0
                    break
            if request.response_headers.end_of_stream:
                # No body will follow: the headers answer carries the new one.
                return self._replaced(b"")
            return HEADERS_ANSWER
        if kind == "response_body":
            self._counters.inc(STAGE, WRAPPED)
            body = wrapped_body(self._status, request.response_body.body)
            answer: bytes = ep.ProcessingResponse(
                response_body=ep.BodyResponse(response=common(body=body))
            ).SerializeToString()
            return answer
        return PASS_THROUGH.get(kind or "", PASS_THROUGH["response_headers"])
