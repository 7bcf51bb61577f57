"""The real token usage of a response, read from its body as it streams past.

The body reaches Python asynchronously (ext_proc observability mode) in chunks
of any size and boundary, so the parsers carry partial lines between chunks
and never raise: a response that cannot be read gives `None` usage and a
`malformed` count, and admission falls back to its estimate or to counting
content chunks. Memory is bounded by `max_json_bytes` per parser.

What is read:
- `usage.prompt_tokens` / `usage.completion_tokens`, or the Responses API's
  `input_tokens` / `output_tokens`; each field keeps the last valid value
  seen, so OpenAI's final `choices: []` chunk, providers that repeat usage on
  every chunk, and providers that send the two counts in different events
  all read right. Values that are not integers in 0..10^9 are ignored.
- In streams, the Responses API's usage in `response.usage` of its final
  `response.completed` / `.incomplete` / `.failed` event, which also counts
  as the end of the stream (it sends no `[DONE]`).
- Content chunks, the fallback when no usage comes: events whose choices carry
  generated text in the delta (`content`, `reasoning_content`, `reasoning`,
  `refusal`, tool-call or function-call `arguments`) or a legacy `text`, or a
  Responses API `*.delta` event with a non-empty delta. Tool calls and
  reasoning are output tokens too, so they count.
"""

from __future__ import annotations

import json
import json.decoder
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from sluicegate import wire

DEFAULT_MAX_JSON_BYTES: Final = 8 * 1024 * 1024
MAX_TOKEN_COUNT: Final = wire.MAX_USAGE_TOKENS
# Kept from an over-long JSON response to find its usage (OpenAI puts it last).
JSON_TAIL_BYTES: Final = 64 * 1024

_DECODER: Final = json.JSONDecoder()
_JSON_MEDIA: Final = re.compile(wire.JSON_MEDIA_TYPE_REGEX)
_skip_ws: Final[Callable[[str, int], re.Match[str]]] = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]
_RESPONSES_END: Final = frozenset(("response.completed", "response.incomplete", "response.failed"))
_DELTA_TEXT: Final = ("content", "reasoning_content", "reasoning", "refusal")


@dataclass(frozen=True, slots=True)
class ObservedUsage:
    """What a response said about its own cost."""

    input_tokens: int | None  # the provider's prompt_tokens / input_tokens, None if none seen
    output_tokens: int | None  # completion_tokens / output_tokens, None if none seen
    content_chunks: int  # SSE events carrying generated content: the fallback count
    malformed: int  # SSE events, over-long lines or JSON documents that did not parse
    done: bool  # saw `data: [DONE]` (or a Responses API final event), or a complete JSON document


class UsageParser(Protocol):
    """Fed every response body chunk in order; `finish` at the end or when the stream is cut."""

    def feed(self, chunk: bytes) -> None: ...

    def finish(self) -> ObservedUsage: ...


def usage_parser(
    content_type: str | None, *, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
) -> UsageParser:
    """The parser for a response of this `content-type` (None: assume JSON).

    Media types that are neither SSE nor JSON (audio, images, plain text) carry
    no usage: their parser ignores the bytes rather than buffer them.
    """
    media = (content_type or "").partition(";")[0].strip().lower()
    if media == "text/event-stream":
        return SseUsageParser(max_json_bytes)
    # The media types Envoy's json_to_metadata reads too (one rule: wire.py).
    if not media or _JSON_MEDIA.fullmatch(media):
        return JsonUsageParser(max_json_bytes)
    return NullUsageParser()


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_COUNT:
        return value
    return None


def _nonempty(value: object) -> bool:
    return isinstance(value, (str, list)) and len(value) > 0


class _Tally:
    """The usage fields seen so far (last valid value of each wins)."""

    __slots__ = ("input_tokens", "output_tokens")

    def __init__(self) -> None:
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None

    def read(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        value = _count(usage.get("prompt_tokens"))
        if value is None:
            value = _count(usage.get("input_tokens"))
        if value is not None:
            self.input_tokens = value
        value = _count(usage.get("completion_tokens"))
        if value is None:
            value = _count(usage.get("output_tokens"))
        if value is not None:
            self.output_tokens = value


def _choice_has_content(choice: object) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for key in _DELTA_TEXT:
            if _nonempty(delta.get(key)):
                return True
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for call in tool_calls:
                if isinstance(call, dict) and _has_arguments(call.get("function")):
                    return True
        if _has_arguments(delta.get("function_call")):
            return True
    return _nonempty(choice.get("text"))


def _has_arguments(function: object) -> bool:
    return isinstance(function, dict) and _nonempty(function.get("arguments"))


class SseUsageParser:
    """Server-sent events: OpenAI-style `data: {json}` chunks ending with `data: [DONE]`.

    Lines end with LF, CRLF or CR (a CR ending one chunk and an LF starting the
    next are one line end). Bytes are split only at CR and LF, which never
    occur inside a multi-byte UTF-8 character, so a character cut across
    chunks is whole again before anything is decoded. An event's data lines
    are joined with LF and read at the blank line that ends it; at `finish`, a
    last unterminated line and event are read too (a cut stream may still have
    said something). Comments and other fields are skipped. A line or an event
    longer than `max_json_bytes` is dropped and counted malformed once.

    Every event is parsed (the C decoder on the UTF-8 text, which also checks
    it): nearly all carry content, which has to be read anyway. A text search
    for non-empty content would cost about half as much but would count
    content approximately and miss malformed events, so it is not used.
    """

    __slots__ = (
        "_after_cr",
        "_content_chunks",
        "_data",
        "_data_size",
        "_done",
        "_dropping_event",
        "_dropping_line",
        "_malformed",
        "_max",
        "_partial",
        "_partial_size",
        "_result",
        "_tally",
    )

    def __init__(self, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> None:
        self._max = max_json_bytes
        self._partial: list[bytes] = []  # pieces of the current unterminated line
        self._partial_size = 0
        self._dropping_line = False  # the current line is over-long: skip to its end
        self._after_cr = False  # the last byte fed was CR: an LF next belongs to it
        self._data: list[bytes] = []  # data lines of the current event
        self._data_size = 0
        self._dropping_event = False  # the current event is over-long: skip to its end
        self._tally = _Tally()
        self._content_chunks = 0
        self._malformed = 0
        self._done = False
        self._result: ObservedUsage | None = None

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the body, in order. Ignored after `finish`."""
        if self._result is not None or not chunk:
            return
        if self._after_cr:
            self._after_cr = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
                if not chunk:
                    return
        if b"\r" in chunk:
            self._after_cr = chunk[-1] == 0x0D
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in chunk:
            self._grow_partial(chunk)
            return
        lines = chunk.split(b"\n")
        tail = lines.pop()
        skip_first = False
        if self._dropping_line:  # lines[0] ends an over-long line, already counted
            self._dropping_line = False
            skip_first = True
        elif self._partial:
            size = self._partial_size + len(lines[0])
            if size > self._max:
                self._malformed += 1
                skip_first = True
            else:
                self._partial.append(lines[0])
                lines[0] = b"".join(self._partial)
            self._partial.clear()
            self._partial_size = 0
        for line in lines[1:] if skip_first else lines:
            self._line(line)
        if tail:
            self._grow_partial(tail)

    def finish(self) -> ObservedUsage:
        """The usage seen; reads what is still pending first. Idempotent."""
        if self._result is None:
            if self._partial:
                line = b"".join(self._partial)
                self._partial.clear()
                self._line(line)
            self._dispatch()
            self._result = ObservedUsage(
                input_tokens=self._tally.input_tokens,
                output_tokens=self._tally.output_tokens,
                content_chunks=self._content_chunks,
                malformed=self._malformed,
                done=self._done,
            )
        return self._result

    def _grow_partial(self, piece: bytes) -> None:
        if self._dropping_line:
            return
        size = self._partial_size + len(piece)
        if size > self._max:
            self._partial.clear()
            self._partial_size = 0
            self._dropping_line = True
            self._malformed += 1
            return
        self._partial.append(piece)
        self._partial_size = size

    def _line(self, line: bytes) -> None:
        if not line:
            self._dispatch()
            return
        if len(line) > self._max:
            self._malformed += 1
            return
        if not line.startswith(b"data"):
            return  # a comment (":..."), event:, id:, retry: or an unknown field
        if len(line) == 4:
            value = b""
        elif line[4] == 0x3A:  # "data:" with or without one space after the colon
            value = line[6:] if line[5:6] == b" " else line[5:]
        else:
            return  # a field whose name only starts with "data"
        if self._dropping_event:
            return
        size = self._data_size + len(value) + (1 if self._data else 0)
        if size > self._max:
            self._data.clear()
            self._data_size = 0
            self._dropping_event = True
            self._malformed += 1
            return
        self._data.append(value)
        self._data_size = size

    def _dispatch(self) -> None:
        if self._dropping_event:
            self._dropping_event = False
            return
        if not self._data:
            return
        payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        self._data.clear()
        self._data_size = 0
        if payload:
            self._event(payload)

    def _event(self, payload: bytes) -> None:
        try:  # str + decoder: about half the cost of json.loads(bytes), which sniffs encodings
            document = _DECODER.decode(payload.decode("utf-8"))
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            if payload.strip() == b"[DONE]":
                self._done = True
            else:
                self._malformed += 1
            return
        if not isinstance(document, dict):
            return
        usage = document.get("usage")
        if usage is not None:
            self._tally.read(usage)
        choices = document.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if _choice_has_content(choice):
                    self._content_chunks += 1
                    break
            return
        kind = document.get("type")  # the Responses API's events
        if isinstance(kind, str):
            if kind.endswith(".delta"):
                if _nonempty(document.get("delta")):
                    self._content_chunks += 1
            elif kind in _RESPONSES_END:
                response = document.get("response")
                if isinstance(response, dict):
                    self._tally.read(response.get("usage"))
                self._done = True


class JsonUsageParser:
    """One JSON document (a non-streamed response), parsed at `finish`.

    Up to `max_json_bytes` is kept. Past that only the last JSON_TAIL_BYTES
    are, and the usage is read from the last `"usage": {...}` in them
    (OpenAI-style responses end with it, and a large embeddings response is
    the usual reason to get here); the document itself then counts malformed
    and not done, as it was never checked. An empty body is neither malformed
    nor done.
    """

    __slots__ = ("_max", "_overflow", "_parts", "_result", "_size")

    def __init__(self, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> None:
        self._max = max_json_bytes
        self._parts: deque[bytes] = deque()
        self._size = 0
        self._overflow = False
        self._result: ObservedUsage | None = None

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the body, in order. Ignored after `finish`."""
        if self._result is not None or not chunk:
            return
        self._parts.append(chunk)
        self._size += len(chunk)
        if self._size > self._max:
            self._overflow = True
        if self._overflow:  # keep only enough whole chunks to cover the tail
            parts = self._parts
            while len(parts) > 1 and self._size - len(parts[0]) >= JSON_TAIL_BYTES:
                self._size -= len(parts.popleft())

    def finish(self) -> ObservedUsage:
        """The usage in the document. Idempotent."""
        if self._result is None:
            tally = _Tally()
            body = b"".join(self._parts)
            self._parts.clear()
            malformed, done = 0, False
            if self._overflow:
                tally.read(_last_usage(body[-JSON_TAIL_BYTES:]))
                malformed = 1
            elif body:
                try:
                    document = json.loads(body)
                except (ValueError, RecursionError):
                    malformed = 1
                else:
                    done = True
                    if isinstance(document, dict):
                        tally.read(document.get("usage"))
            self._result = ObservedUsage(
                tally.input_tokens, tally.output_tokens, 0, malformed, done
            )
        return self._result


def _last_usage(tail: bytes) -> object:
    """The value of the last `"usage"` member in a piece of JSON text, if it parses.

    Best effort, for documents too large to parse: a quote inside a JSON string
    is escaped, so text in a string value cannot match, only a member name.
    """
    text = tail.decode("utf-8", "replace")
    at = text.rfind('"usage"')
    if at < 0:
        return None
    colon = _skip_ws(text, at + 7).end()
    if text[colon : colon + 1] != ":":
        return None
    try:
        value, _ = _DECODER.raw_decode(text, _skip_ws(text, colon + 1).end())
    except (ValueError, RecursionError):
        return None
    return value


class NullUsageParser:
    """For bodies that carry no usage (audio, images, text): ignores them."""

    __slots__ = ()

    def feed(self, chunk: bytes) -> None:
        """Ignore the chunk."""

    def finish(self) -> ObservedUsage:
        """Nothing seen."""
        return ObservedUsage(None, None, 0, 0, False)
