"""Find one top-level member of a JSON object, with its exact position in the text.

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

BodyProblem = Literal["json", "object", "duplicate"]


class BodyError(ValueError):
    """The body is not what the gateway accepts; `problem` says which way."""

    def __init__(self, problem: BodyProblem) -> None:
        super().__init__(problem)
        self.problem: BodyProblem = problem


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
    try:
        return _find_member(text, key)
    except BodyError:
        raise
    except (ValueError, StopIteration, RecursionError, IndexError):
        raise BodyError("json") from None


def _find_member(text: str, key: str) -> Member | None:
    size = len(text)
    idx = _skip_ws(text, 0).end()
    if idx >= size:
        raise BodyError("json")
    if text[idx] != "{":
        _, end = _scan_once(text, idx)  # raises for invalid JSON
        if _skip_ws(text, end).end() != size:
            raise BodyError("json")
        raise BodyError("object")
    found: Member | None = None
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
            if name == key:
                if found is not None:
                    raise BodyError("duplicate")
                found = Member(value, start, idx)
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
    return found
