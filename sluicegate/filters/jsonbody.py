"""Find top-level members of a JSON object, with their exact positions in the text.

`json.loads` gives values but not positions. The attempt stage must replace
the `model` value and keep every other byte of the body as the client sent it,
so this walks the top level with the C scanner the json module itself uses
(`JSONDecoder.scan_once`), which parses each member value fully: the document
is validated exactly as `json.loads` would, in one pass.
"""

from __future__ import annotations

import json
import json.decoder
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

_DECODER: Final = json.JSONDecoder()
# Undocumented but long-stable parts of the json module (C-accelerated).
_scan_once: Final[Callable[[str, int], tuple[object, int]]] = _DECODER.scan_once  # type: ignore[attr-defined]
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]
_skip_ws: Final[Callable[[str, int], re.Match[str]]] = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]

BodyProblem = Literal[
    "json",  # not UTF-8 JSON
    "object",  # valid JSON, not an object
    "duplicate",  # a member the gateway reads occurs twice
    "model",  # model missing or empty
    "model_type",  # model not a string
    "max_tokens",  # max_tokens / max_completion_tokens / max_output_tokens out of range
    "n",  # n not an integer in 1..128
    "stream",  # stream not a boolean
    "stream_options",  # stream_options not an object, or include_usage not a boolean
]


class BodyError(ValueError):
    """The body is not what the gateway accepts.

    `problem` says which way; `member` names the member at fault when there is
    one (a duplicate, or which of the max-tokens spellings was out of range), so
    the client's error can name the parameter it actually sent.
    """

    def __init__(self, problem: BodyProblem, member: str | None = None) -> None:
        super().__init__(problem if member is None else f"{problem}: {member}")
        self.problem: BodyProblem = problem
        self.member: str | None = member


@dataclass(frozen=True, slots=True)
class Member:
    """A member's parsed value and its [start, end) span in the text."""

    value: object
    start: int
    end: int


def decode_utf8(body: bytes) -> str:
    """The body as text; anything but UTF-8 is not JSON here."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError("json") from None


def find_member(text: str, key: str) -> Member | None:
    """Parse `text` as one JSON object and return its member `key`, if present.

    Raises BodyError("json") for text json.loads would reject, ("object") for
    valid JSON that is not an object, ("duplicate") if `key` occurs twice.
    """
    return find_members(text, frozenset((key,))).get(key)


def find_members(text: str, keys: frozenset[str]) -> dict[str, Member]:
    """Parse `text` as one JSON object and return its members named in `keys`.

    One pass over the top level; every value (wanted or not) is fully parsed,
    so the errors are find_member's; ("duplicate"), raised only for otherwise
    valid JSON, names in `BodyError.member` the first of `keys` seen twice.
    Duplicates of other names are left to json.loads' rule (the last wins), as
    the provider will apply it.
    """
    try:
        return _scan(text, keys)
    except BodyError:
        raise
    except (ValueError, StopIteration, RecursionError, IndexError):
        raise BodyError("json") from None


def _scan(text: str, keys: frozenset[str]) -> dict[str, Member]:
    size = len(text)
    idx = _skip_ws(text, 0).end()
    if idx >= size:
        raise BodyError("json")
    if text[idx] != "{":
        _, end = _scan_once(text, idx)  # raises for invalid JSON
        if _skip_ws(text, end).end() != size:
            raise BodyError("json")
        raise BodyError("object")
    found: dict[str, Member] = {}
    duplicate: str | None = None  # reported after the whole text is validated
    idx = _skip_ws(text, idx + 1).end()
    if text[idx] == "}":
        idx += 1
    else:
        while True:
            if text[idx] != '"':
                raise BodyError("json")
            name, idx = _scanstring(text, idx + 1, True)
            idx = _skip_ws(text, idx).end()
            if text[idx] != ":":
                raise BodyError("json")
            start = _skip_ws(text, idx + 1).end()
            value, idx = _scan_once(text, start)
            if name in keys:
                if name in found:
                    duplicate = duplicate or name
                else:
                    found[name] = Member(value, start, idx)
            idx = _skip_ws(text, idx).end()
            separator = text[idx]
            if separator == "}":
                idx += 1
                break
            if separator != ",":
                raise BodyError("json")
            idx = _skip_ws(text, idx + 1).end()
    if _skip_ws(text, idx).end() != size:
        raise BodyError("json")
    if duplicate is not None:
        raise BodyError("duplicate", duplicate)
    return found
