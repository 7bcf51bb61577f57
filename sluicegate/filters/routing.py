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

This module decides what the body routes to; the per-request object that answers each
message, and tells the request record what it learnt (admission/record.py), is
admission.AdmissionStream, with or without admission.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from sluicegate import wire

from . import counters as outcome
from . import errors
from .counters import Counters
from .jsonbody import BodyError, Member, decode_utf8, find_members
from .request_facts import LOGPROBS_MEMBERS, MAX_TOKENS_MEMBERS, read_model, read_stream
from .responses import common, request_headers_answer
from .table import RoutingTable

STAGE = wire.STAGE_ROUTING
# The model and stream flag route; the others only decide who reads the usage
# (usage_reader.py), read leniently: checking them is the provider's job here.
_ROUTED: Final = frozenset(("model", "stream"))
_MEMBERS: Final = _ROUTED | frozenset(
    ("stream_options", "n", *LOGPROBS_MEMBERS, *MAX_TOKENS_MEMBERS)
)


def _bodiless_answer() -> bytes:
    response = common(clear_route_cache=True)
    response.header_mutation.remove_headers.append(wire.MODEL_HEADER)
    return request_headers_answer(response)


BODILESS_ANSWER: Final = _bodiless_answer()


class BodyRoute(NamedTuple):
    """The answer to a request body, and what it was read as."""

    answer: bytes
    model: str | None  # None: the body was refused before its model was read
    stream: bool | None  # None: unread, as `model`
    routed: bool  # a route serves the model: `answer` routes it
    members: dict[str, Member] | None = None  # as read (None: the body was refused)
    # The members that decide who reads the usage were read too (not when one of them is
    # repeated: the provider judges that; only `model` and `stream` are checked here).
    usage_members: bool = True


def read_body(body: bytes, table: RoutingTable, counters: Counters) -> BodyRoute:
    """Read a buffered request body's model and stream flag, and route it."""
    usage_members = True
    try:
        text = decode_utf8(body)
        try:
            members = find_members(text, _MEMBERS)
        except BodyError as exc:
            if exc.problem != "duplicate" or exc.member in _ROUTED:
                raise
            members, usage_members = find_members(text, _ROUTED), False
        model = read_model(members.get("model"))
        stream = read_stream(members.get("stream"))
    except BodyError as exc:
        counters.inc(STAGE, outcome.BAD_REQUEST)
        return BodyRoute(errors.body_error(exc), None, None, routed=False)
    answer = table.routed_answer(model, stream=stream)
    if answer is None:
        counters.inc(STAGE, outcome.MODEL_NOT_FOUND)
        return BodyRoute(
            errors.model_not_found(model), model, stream, False, members, usage_members
        )
    counters.inc(STAGE, outcome.ROUTED)
    return BodyRoute(answer, model, stream, True, members, usage_members)


def decide(body: bytes, table: RoutingTable, counters: Counters) -> bytes:
    """The serialized answer for a buffered request body."""
    return read_body(body, table, counters).answer
