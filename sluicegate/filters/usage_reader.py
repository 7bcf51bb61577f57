"""Who reads a routed request's usage, and a stream's usage event asked for the client.

The routing stage tells Envoy, in wire.USAGE_HEADER, which filter reads the usage of
each request it routes (xds/translate/usage.py wraps each reader in a matcher on it):

- a stream: Envoy's sse_to_metadata, and the stream usage Lua filter when the stream
  needs its chunks read: a usage event to cut (asked for the client), or content events
  to count (a reservation to charge) (xds/translate/stream_usage.py; a Lua filter costs
  Envoy even when it reads no chunk);
- a small JSON answer: Envoy's json_to_metadata;
- a large JSON answer with a reservation: the usage observer, in Python; without one,
  nobody (Envoy would parse it whole in its worker, about 40 ms a MB:
  benchmarks/json_usage_cost.py, +1.0 ms for 20 KB, +80 ms for 2 MB).

A chat or completions stream reports its usage only when the body asks for it
(`stream_options.include_usage`). When the client did not ask, the routing stage asks
for it (a splice, no parse; the whole body then goes back to Envoy in the answer) and
marks the request (wire.META_USAGE_INJECTED), so Envoy cuts the usage event out of what
the client receives. A body that has `stream_options` without `include_usage` is left as it is (its
other options would have to be rewritten), nor one with `"stream_options": null`: such a
stream is counted (Lua) instead.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from sluicegate import wire

from .jsonbody import Member
from .request_facts import MAX_TOKENS_MEMBERS, asks_logprobs
from .responses import common, metadata_field, request_body_answer, set_header

# Text generation endpoints: their JSON answers are read by Envoy when small.
_LOGGED_ENDPOINTS: Final = wire.GENERATION_ENDPOINTS
# Endpoints that take `stream_options.include_usage` (the Responses API always reports it).
_INJECT_ENDPOINTS: Final = wire.STREAM_USAGE_ENDPOINTS
LOG_MAX_OUTPUT_TOKENS: Final = wire.LOG_MAX_OUTPUT_TOKENS
_INCLUDE_USAGE: Final = wire.INCLUDE_USAGE_MEMBER.encode()

# The reader as an answer to merge into the routed one.
READER_ANSWERS: Final = {
    reader: request_body_answer(common([set_header(wire.USAGE_HEADER, reader.encode())]))
    for reader in wire.USAGE_READERS
}
# The record's entry that tells the stream usage filter to cut the usage event.
INJECTED_FIELD: Final = metadata_field(wire.META_USAGE_INJECTED, wire.USAGE_INJECTED_TRUE)


def endpoint(path: str | None) -> str:
    """The request path without its query and trailing slash."""
    return (path or "").partition("?")[0].rstrip("/")


def small_json_answer(path: str | None, *, logprobs: bool, output_allowance: int) -> bool:
    """Whether a JSON answer's usage may be read by Envoy: a text generation endpoint, no
    log probabilities, at most LOG_MAX_OUTPUT_TOKENS allowed out. Embeddings (MBs of
    floats, no output count), images, logprobs and long answers are not."""
    return (
        endpoint(path).endswith(_LOGGED_ENDPOINTS)
        and not logprobs
        and output_allowance <= LOG_MAX_OUTPUT_TOKENS
    )


def json_reader(path: str | None, *, logprobs: bool, output_allowance: int, reserved: bool) -> str:
    """The reader of a JSON answer (module docstring)."""
    if small_json_answer(path, logprobs=logprobs, output_allowance=output_allowance):
        return wire.USAGE_BY_LOG
    return wire.USAGE_BY_OBSERVER if reserved else wire.USAGE_UNREAD


def asks_usage(path: str | None, *, has_stream_options: bool, allowed: bool = True) -> bool:
    """Whether to ask for a stream's usage event: the route's providers take the option
    (`allowed`: model.Route.asks_stream_usage), an endpoint that takes it, and a body
    without the member (even `null`: a second member of the same name would be read last
    by most parsers, so the splice would be lost)."""
    return allowed and not has_stream_options and endpoint(path).endswith(_INJECT_ENDPOINTS)


def stream_reader(*, reserved: bool) -> str:
    """The reader of a stream whose usage event the gateway did not ask for (one it asked
    for is cut, so its chunks are read: with_usage_asked): its chunks are read (Lua) only
    to count content events for a reservation."""
    return wire.USAGE_BY_STREAM_CHUNKS if reserved else wire.USAGE_BY_STREAM


def with_usage_asked(body: bytes) -> bytes:
    """The body answer piece that sends `body` with `stream_options.include_usage` (spliced
    after the object's opening brace: a body that parsed is an object with a member, so a
    comma follows) and its new length; merge it into the routed answer. Its usage event
    is cut, so the stream's chunks are read."""
    at = body.index(b"{") + 1
    new_body = body[:at] + _INCLUDE_USAGE + body[at:]
    length = set_header("content-length", str(len(new_body)).encode())
    reader = set_header(wire.USAGE_HEADER, wire.USAGE_BY_STREAM_CHUNKS.encode())
    return request_body_answer(common([reader, length], new_body))


class UsageReading(NamedTuple):
    """Who reads a request's usage, as the answer piece to merge into the routed answer."""

    answer: bytes
    reader: str  # one of wire.USAGE_READERS
    injected: bool  # the usage event was asked for the client (the record: INJECTED_FIELD)


def usage_answer(
    body: bytes,
    path: str | None,
    *,
    stream: bool,
    has_stream_options: bool,
    logprobs: bool,
    output_allowance: int,
    reserved: bool,
    ask_allowed: bool = True,
) -> UsageReading:
    """Who reads the usage of a request (module docstring), and for a stream whether its
    usage event is asked for the client (`ask_allowed`: asks_usage's `allowed`)."""
    if stream:
        if asks_usage(path, has_stream_options=has_stream_options, allowed=ask_allowed):
            return UsageReading(with_usage_asked(body), wire.USAGE_BY_STREAM_CHUNKS, injected=True)
        reader = stream_reader(reserved=reserved)
        return UsageReading(READER_ANSWERS[reader], reader, injected=False)
    reader = json_reader(
        path, logprobs=logprobs, output_allowance=output_allowance, reserved=reserved
    )
    return UsageReading(READER_ANSWERS[reader], reader, injected=False)


def _whole(member: Member | None) -> int | None:
    value = None if member is None else member.value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def routed_usage_answer(
    body: bytes,
    path: str | None,
    members: dict[str, Member],
    stream: bool,
    default_max: int,
    ask_allowed: bool = True,
    *,
    members_read: bool = True,
) -> UsageReading:
    """usage_answer for a request routed without admission, its members read leniently
    (unchecked: the provider checks them): the first whole output cap, else `default_max`,
    times a whole `n`. `members_read` False (one was repeated): a stream is sent as it is,
    and a JSON answer read by nobody."""
    if not members_read:
        reader = stream_reader(reserved=False) if stream else wire.USAGE_UNREAD
        return UsageReading(READER_ANSWERS[reader], reader, injected=False)
    cap = next(
        (v for name in MAX_TOKENS_MEMBERS if (v := _whole(members.get(name))) is not None), None
    )
    n = _whole(members.get("n"))
    allowance = (default_max if cap is None else cap) * (n if n is not None and n > 0 else 1)
    return usage_answer(
        body,
        path,
        stream=stream,
        has_stream_options="stream_options" in members,
        logprobs=asks_logprobs(members),
        output_allowance=allowance,
        reserved=False,
        ask_allowed=ask_allowed,
    )
