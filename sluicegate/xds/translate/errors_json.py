"""OpenAI-format error bodies for replies Envoy makes itself (the `/models` listings'
format lives in sluicegate.wire, shared with the ext_proc filter).

Clients of an OpenAI-compatible API parse `{"error": {"message", "type", "param",
"code"}}` on every non-2xx answer, so no error may leave the gateway in Envoy's plain
text. The table below says which OpenAI `type`/`code` each HTTP status of an
Envoy-originated reply (local reply) gets; `listeners.py` turns it into the HCM's
`local_reply_config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LocalReplyError:
    """How a local reply with `status` is presented. `message` is an Envoy format string."""

    status: int
    type: str
    code: str | None
    message: str = "%LOCAL_REPLY_BODY%"
    # The status the client gets instead of `status` (a client fault Envoy answers 5xx).
    answered_as: int | None = None


# Bodies of the 404 direct responses; the 404 entry below adds method and path.
# Outside every route prefix (OpenAI's own wording):
UNKNOWN_PATH_MESSAGE = "Invalid URL"
# Under a route prefix, when the routing stage let the request through without a model:
NO_MODEL_ROUTE_MESSAGE = "Invalid URL, or the request names no model served here"

# Envoy-originated replies, by status. Statuses not listed: 4xx → invalid_request_error,
# anything else → server_error (both with code null).
LOCAL_REPLY_ERRORS: tuple[LocalReplyError, ...] = (
    # Malformed HTTP from the client (Envoy's codec).
    LocalReplyError(400, "invalid_request_error", "bad_request"),
    # The catch-all route. %REQ_WITHOUT_QUERY% keeps query strings (maybe keys) out.
    LocalReplyError(
        404,
        "invalid_request_error",
        "unknown_url",
        "%LOCAL_REPLY_BODY% (%REQ(:METHOD)% %REQ_WITHOUT_QUERY(:PATH):200%)",
    ),
    # The client was too slow sending its request.
    LocalReplyError(408, "invalid_request_error", "request_timeout"),
    # Body above limits.max_request_body_bytes while ext_proc buffers it; the listener
    # builder replaces the message with one naming the limit.
    LocalReplyError(413, "invalid_request_error", "request_too_large"),
    LocalReplyError(431, "invalid_request_error", "request_headers_too_large"),
    # Envoy's codec refuses what it does not implement with 501, e.g. `Transfer-Encoding:
    # gzip, chunked` (details http1.invalid_transfer_encoding): the client's fault, so 400.
    LocalReplyError(
        501,
        "invalid_request_error",
        "unsupported_request",
        "The request uses an HTTP feature the gateway does not support (%RESPONSE_CODE_DETAILS%)",
        answered_as=400,
    ),
    # ext_proc failures (gRPC error, server unreachable) and other internal errors.
    # Envoy gives these an empty body; the details name the cause, e.g.
    # "ext_proc_error_gRPC_error_14{…}".
    LocalReplyError(
        500, "server_error", "internal_error", "Gateway error (%RESPONSE_CODE_DETAILS%)"
    ),
    LocalReplyError(502, "server_error", "bad_gateway"),
    # No healthy provider, connect failure, reset, pool overflow.
    LocalReplyError(503, "server_error", "upstream_unavailable"),
    # Route / per-try timeout ("upstream_response_timeout", "upstream_per_try_timeout"), or
    # the ext_proc server did not answer in time (Envoy's body is then empty).
    LocalReplyError(
        504, "server_error", "upstream_timeout", "Request timed out (%RESPONSE_CODE_DETAILS%)"
    ),
)


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    """One OpenAI error object as compact JSON bytes."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json.dumps(body, separators=(",", ":")).encode()


def error_struct(message: str, type_: str, code: str | None) -> dict[str, Any]:
    """The same object as a dict for Envoy's `json_format` (string values are formats)."""
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}
