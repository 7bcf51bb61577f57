"""Reading a streamed answer: server-sent events split on bytes as they arrive, and the
timing of the events that carry content (vLLM's definitions, docs/bench.md, "Metrics").

An event carries content when its first choice has non-empty `delta.content` (chat),
`delta.reasoning_content` / `delta.reasoning` (reasoning models) or `text` (completions).
Every event that arrived in one read shares that read's time.
"""

from __future__ import annotations

import json
from array import array
from typing import Any


class StreamReader:
    __slots__ = (
        "_pending",
        "completion_tokens",
        "content_events",
        "done",
        "error_code",
        "first",
        "gaps",
        "last",
        "malformed",
        "prompt_tokens",
    )  # fmt: skip

    def __init__(self) -> None:
        self._pending = b""
        self.first: float | None = None  # time of the first content event
        self.last = 0.0  # time of the latest content event
        self.gaps = array("d")  # inter-token latencies: gaps between content events
        self.content_events = 0
        self.completion_tokens: int | None = None  # from the usage event, when sent
        self.prompt_tokens: int | None = None
        self.done = False  # `data: [DONE]` seen
        self.malformed = 0  # events whose data was not JSON
        self.error_code: str | None = None  # an `error` event's code ("" if it has none)

    def feed(self, data: bytes, now: float) -> None:
        buffer = self._pending + data if self._pending else data
        if b"\r" in buffer:
            # Rare (sse-starlette, some proxies): CRLF line ends, read as LF; a CR at the
            # end waits for its LF.
            buffer = buffer.replace(b"\r\n", b"\n")
            if buffer.endswith(b"\r"):
                self._pending = self._split(buffer[:-1], now) + b"\r"
                return
        self._pending = self._split(buffer, now)

    def _split(self, buffer: bytes, now: float) -> bytes:
        start = 0
        while True:
            end = buffer.find(b"\n\n", start)
            if end < 0:
                return buffer[start:]
            if end > start:
                self._event(buffer[start:end], now)
            start = end + 2

    def _event(self, event: bytes, now: float) -> None:
        if event.startswith(b"data:") and b"\n" not in event:
            data = event[5:]  # the common case: one data line
        else:
            parts = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
            if not parts:
                return  # a comment (": keep-alive") or an event without data
            data = b"\n".join(part[1:] if part.startswith(b" ") else part for part in parts)
            self._data(data, now)
            return
        self._data(data[1:] if data.startswith(b" ") else data, now)

    def _data(self, data: bytes, now: float) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        try:
            payload: Any = json.loads(data)
        except ValueError:
            self.malformed += 1
            return
        if not isinstance(payload, dict):
            return
        choices = payload.get("choices")
        if choices and isinstance(choices, list) and isinstance(choices[0], dict):
            choice = choices[0]
            delta = choice.get("delta")
            if isinstance(delta, dict):
                text = (
                    delta.get("content") or delta.get("reasoning_content")
                    or delta.get("reasoning")
                )  # fmt: skip
            else:
                text = choice.get("text")
            if text:
                if self.first is None:
                    self.first = now
                else:
                    self.gaps.append(now - self.last)
                self.last = now
                self.content_events += 1
        usage = payload.get("usage")
        if isinstance(usage, dict):
            completion = usage.get("completion_tokens")
            if isinstance(completion, int) and not isinstance(completion, bool):
                self.completion_tokens = completion
            prompt = usage.get("prompt_tokens")
            if isinstance(prompt, int) and not isinstance(prompt, bool):
                self.prompt_tokens = prompt
        error = payload.get("error")
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            self.error_code = str(code) if code is not None else ""
