"""What admission needs to know about a request body, read in one pass.

The body is scanned once (`find_members`: validated like `json.loads`, only the
members below are kept, with their spans), the few parameters that decide a
reservation are checked the way OpenAI checks them, and the prompt is
estimated from the spans of the members that reach the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sluicegate import wire

from .estimate import estimate_span_tokens
from .jsonbody import BodyError, Member, decode_utf8, find_members

MAX_N: Final = wire.MAX_N
PROMPT_MEMBERS: Final = wire.PROMPT_MEMBERS
# Spellings of the output cap, first wins: chat (new, legacy) and the Responses API.
MAX_TOKENS_MEMBERS: Final = wire.MAX_TOKENS_MEMBERS
# Asking for log probabilities: the answer may then be many times the size of its text.
LOGPROBS_MEMBERS: Final = wire.LOGPROBS_MEMBERS
READ_MEMBERS: Final = frozenset(wire.BODY_READ_MEMBERS)


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """The parameters of a request that decide its reservation."""

    model: str
    stream: bool
    include_usage: bool  # stream_options.include_usage is true
    max_tokens: int | None  # the first of MAX_TOKENS_MEMBERS present and not null
    n: int  # choices requested (default 1)
    prompt_tokens: int  # estimate.py's estimate over PROMPT_MEMBERS
    # Any LOGPROBS_MEMBERS present with a value that is not false, null, 0 or empty: not
    # checked (providers do), only noted, because it makes the answer large.
    logprobs: bool = False
    has_stream_options: bool = False  # the member is there (null too)


def inspect_request(body: bytes, *, max_output_tokens: int) -> RequestFacts:
    """Read and check a request body; BodyError (nothing else) when it is refused.

    `max_output_tokens` is the largest output cap the gateway accepts.
    """
    text = decode_utf8(body)
    members = find_members(text, READ_MEMBERS)
    return RequestFacts(
        model=read_model(members.get("model")),
        stream=read_stream(members.get("stream")),
        include_usage=_include_usage(members.get("stream_options")),
        max_tokens=_max_tokens(members, max_output_tokens),
        n=_n(members.get("n")),
        prompt_tokens=estimate_span_tokens(
            text, [(m.start, m.end) for name in PROMPT_MEMBERS if (m := members.get(name))]
        ),
        logprobs=asks_logprobs(members),
        has_stream_options="stream_options" in members,
    )


def asks_logprobs(members: dict[str, Member]) -> bool:
    """Any LOGPROBS_MEMBERS with a value that is not false, null, 0 or empty."""
    return any(bool(m.value) for name in LOGPROBS_MEMBERS if (m := members.get(name)))


def _in_range(value: object, low: int, high: int) -> bool:
    """A JSON integer (not a bool, not 3.0) in [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def read_model(member: Member | None) -> str:
    """The request's `model`: absent or "" is missing, anything but a string (null
    included) a type error. The routing and admission stages both answer by this rule."""
    if member is None or member.value == "":
        raise BodyError("model", "model")
    if not isinstance(member.value, str):
        raise BodyError("model_type", "model")
    return member.value


def read_stream(member: Member | None) -> bool:
    if member is None or member.value is None:
        return False
    if not isinstance(member.value, bool):
        raise BodyError("stream", "stream")
    return member.value


def _include_usage(member: Member | None) -> bool:
    if member is None or member.value is None:
        return False
    if not isinstance(member.value, dict):
        raise BodyError("stream_options", "stream_options")
    include = member.value.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise BodyError("stream_options", "stream_options")
    return include is True


def _max_tokens(members: dict[str, Member], limit: int) -> int | None:
    chosen: int | None = None
    for name in MAX_TOKENS_MEMBERS:  # every spelling sent is checked, the first is used
        member = members.get(name)
        if member is None or member.value is None:
            continue
        value = member.value
        if not isinstance(value, int) or not _in_range(value, 1, limit):
            raise BodyError("max_tokens", name)
        if chosen is None:
            chosen = value
    return chosen


def _n(member: Member | None) -> int:
    if member is None or member.value is None:
        return 1
    value = member.value
    if not isinstance(value, int) or not _in_range(value, 1, MAX_N):
        raise BodyError("n", "n")
    return value
