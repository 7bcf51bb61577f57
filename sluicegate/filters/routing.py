"""Routing stage (downstream filter): read the body's `model`, pick the route.

Envoy sends the request headers, then the buffered body. Headers must be sent
(request_header_mode SEND): with SKIP the router matches the route on the
headers before the body arrives. The answer to the body sets the model header
and clears the route cache so Envoy matches routes again on it.

On the headers, before anything else, request_limits.py refuses too many or too large
headers (431) and a declared body over the limit (413).

A request without a body (GET /v1/models, ...) has no model: the answer to its
headers removes any client-sent model header and clears the route cache, so
only routes that do not need a model (direct responses, the fallback) match.
"""

from __future__ import annotations

from typing import Any, Final

from sluicegate import wire

from . import counters as outcome
from . import errors
from .counters import Counters
from .jsonbody import BodyError, decode_utf8, find_members
from .request_facts import read_model, read_stream
from .responses import (
    CONTINUE_REQUEST_HEADERS,
    PASS_THROUGH,
    common,
    request_headers_answer,
    with_path,
)
from .table import RoutingTable

STAGE = wire.STAGE_ROUTING
_MEMBERS: Final = frozenset(("model", "stream"))


def _bodiless_answer() -> bytes:
    response = common(clear_route_cache=True)
    response.header_mutation.remove_headers.append(wire.MODEL_HEADER)
    return request_headers_answer(response)


BODILESS_ANSWER: Final = _bodiless_answer()


def decide(body: bytes, table: RoutingTable, counters: Counters) -> bytes:
    """The serialized answer for a buffered request body."""
    try:
        members = find_members(decode_utf8(body), _MEMBERS)
        model = read_model(members.get("model"))
        stream = read_stream(members.get("stream"))
    except BodyError as exc:
        counters.inc(STAGE, outcome.BAD_REQUEST)
        return errors.BODY_PROBLEMS[exc.problem]
    answer = table.routed_answer(model, stream=stream)
    if answer is None:
        counters.inc(STAGE, outcome.MODEL_NOT_FOUND)
        return errors.model_not_found(model)
    counters.inc(STAGE, outcome.ROUTED)
    return answer


def on_message(request: Any, table: RoutingTable, counters: Counters) -> bytes:
    """Answer one ProcessingRequest of the routing stage."""
    kind = request.WhichOneof("request")
    if kind == "request_body":
        return decide(request.request_body.body, table, counters)
    if kind == "request_headers":
        check = table.check_headers(request.request_headers)
        if check.refusal is not None:
            counters.inc(STAGE, outcome.BAD_REQUEST)
            return check.refusal
        answer = CONTINUE_REQUEST_HEADERS
        if request.request_headers.end_of_stream:
            counters.inc(STAGE, outcome.NO_BODY)
            answer = BODILESS_ANSWER
        return answer if check.path is None else with_path(answer, check.path)
    return PASS_THROUGH.get(kind or "", CONTINUE_REQUEST_HEADERS)
