"""OpenAI-format error bodies for replies Envoy makes itself (the `/models` listings'
format lives in sluicegate.wire, shared with the ext_proc filter).

Clients of an OpenAI-compatible API parse `{"error": {"message", "type", "param",
"code"}}` on every non-2xx answer, so no error may leave the gateway in Envoy's plain
text. LOCAL_REPLY_ERRORS (sluicegate.local_replies, shared with the request record) says
which OpenAI `type`/`code` each HTTP status of an Envoy-originated reply (local reply)
gets; `listeners.py` turns it into the HCM's `local_reply_config`.
"""

from __future__ import annotations

import json
from typing import Any

from envoy.config.core.v3 import base_pb2

from sluicegate.local_replies import LOCAL_REPLY_ERRORS as LOCAL_REPLY_ERRORS
from sluicegate.local_replies import LocalReplyError as LocalReplyError

from ._proto import set_headers

# Bodies of the 404 direct responses; LOCAL_REPLY_ERRORS' 404 row adds method and path.
# Outside every route prefix (OpenAI's own wording):
UNKNOWN_PATH_MESSAGE = "Invalid URL"
# Under a route prefix, when the routing stage let the request through without a model:
NO_MODEL_ROUTE_MESSAGE = "Invalid URL, or the request names no model served here"


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    """One OpenAI error object as compact JSON bytes."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json.dumps(body, separators=(",", ":")).encode()


def error_struct(message: str, type_: str, code: str | None) -> dict[str, Any]:
    """The same object as a dict for Envoy's `json_format` (string values are formats)."""
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def json_reply_headers() -> list[base_pb2.HeaderValueOption]:
    """The content type a JSON reply Envoy makes itself carries: the listener's
    local_reply_config passes such a reply through unchanged by it (listeners.py)."""
    return set_headers(("content-type", "application/json"))
