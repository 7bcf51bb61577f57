"""One measured request (a `Sample`), made from its answer.

Kinds: `ok`; `http` (an error status); `refusal` (a 429 or 503 the gateway made itself:
it carries the refusal header, whose value is the error code); `connection`, `timeout`,
`incomplete`, `bad_response` (no usable answer: see sluicegate.bench.http).

TTFT is from writing the request to the first event with content; for a JSON answer it
is the whole answer's time (its content arrives all at once). TPOT is
(E2E - TTFT) / (output tokens - 1), for streams with more than one output token; output
tokens come from the usage the server reported, else the count of content events.
"""

from __future__ import annotations

import json
import re
from array import array
from typing import Any, Final, NamedTuple

from sluicegate.bench.http import BAD_RESPONSE, Exchange

OK: Final = "ok"
HTTP_ERROR: Final = "http"
REFUSAL: Final = "refusal"
REFUSAL_STATUSES: Final = frozenset({429, 503})
_COMPLETION: Final = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT: Final = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


class Sample(NamedTuple):
    start: float  # seconds since the phase started (send time)
    scenario: str
    priority: str
    kind: str
    status: int  # 0 without an HTTP answer
    code: str | None  # OpenAI error.code (or the refusal header's value)
    ttft: float | None
    e2e: float
    output_tokens: int
    input_tokens: int | None
    itl: array[float] | None
    retry_after: float | None
    queue_s: float | None

    @property
    def ok(self) -> bool:
        return self.kind == OK

    @property
    def tpot(self) -> float | None:
        if self.kind != OK or self.ttft is None or self.itl is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def sample_of(
    exchange: Exchange,
    sent: float,
    phase_start: float,
    scenario: str,
    priority: str,
    input_tokens: int | None,
    refusal_header: str,
    queue_header: str,
) -> Sample:
    """Classify and time one finished exchange (`sent`: when the request was written)."""
    e2e = exchange.end - sent
    start = sent - phase_start
    headers = exchange.headers
    queue = _queue_s(headers.get(queue_header))
    status = exchange.status
    if exchange.error is not None:
        reader = exchange.reader
        tokens = reader.content_events if reader else 0
        return Sample(start, scenario, priority, exchange.error, status, None, None, e2e,
                      tokens, input_tokens, None, None, queue)  # fmt: skip
    if status >= 400 or status < 200:
        code, retry_after = _error_code(exchange.body), _retry_after(headers.get("retry-after"))
        refusal = headers.get(refusal_header)
        if refusal is not None and status in REFUSAL_STATUSES:
            return Sample(start, scenario, priority, REFUSAL, status, refusal or code, None, e2e,
                          0, input_tokens, None, retry_after, queue)  # fmt: skip
        return Sample(start, scenario, priority, HTTP_ERROR, status, code, None, e2e, 0,
                      input_tokens, None, retry_after, queue)  # fmt: skip
    reader = exchange.reader
    if reader is not None:
        if reader.error_code is not None:
            return Sample(start, scenario, priority, HTTP_ERROR, status,
                          reader.error_code or None, None, e2e, reader.content_events,
                          input_tokens, None, None, queue)  # fmt: skip
        if reader.first is None:
            # A stream that never carried content: nothing to time (vLLM counts it failed).
            return Sample(start, scenario, priority, BAD_RESPONSE, status, None, None, e2e, 0,
                          input_tokens, None, None, queue)  # fmt: skip
        counted = reader.completion_tokens
        output = counted if counted is not None else reader.content_events
        prompt = reader.prompt_tokens if reader.prompt_tokens is not None else input_tokens
        return Sample(start, scenario, priority, OK, status, None, reader.first - sent, e2e,
                      output, prompt, reader.gaps, None, queue)  # fmt: skip
    usage = _usage(exchange.body)
    if usage is None:
        return Sample(start, scenario, priority, BAD_RESPONSE, status, None, None, e2e, 0,
                      input_tokens, None, None, queue)  # fmt: skip
    completion, prompt = usage
    return Sample(start, scenario, priority, OK, status, None, e2e, e2e, completion,
                  prompt if prompt is not None else input_tokens, None, None, queue)  # fmt: skip


def failed_sample(
    sent: float, phase_start: float, now: float, scenario: str, priority: str, kind: str,
    input_tokens: int | None,
) -> Sample:  # fmt: skip
    """A request that never got a connection."""
    return Sample(sent - phase_start, scenario, priority, kind, 0, None, None, now - sent, 0,
                  input_tokens, None, None, None)  # fmt: skip


def _usage(body: bytes) -> tuple[int, int | None] | None:
    """(completion tokens, prompt tokens) of a JSON answer; None if it is not JSON. An
    answer without usage counts 0 output tokens."""
    # Fast path: the usage member is last in OpenAI's answers; text inside a JSON string
    # cannot match (its quotes are escaped), so the last match is the real member.
    start = body.rfind(b'"usage"')
    if start >= 0 and body.rstrip().endswith(b"}"):
        completion = _COMPLETION.search(body, start)
        if completion is not None:
            prompt = _PROMPT.search(body, start)
            return int(completion.group(1)), int(prompt.group(1)) if prompt else None
    try:
        payload: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return 0, None
    completion = usage.get("completion_tokens")
    prompt = usage.get("prompt_tokens")
    return (
        completion if isinstance(completion, int) and not isinstance(completion, bool) else 0,
        prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None,
    )


def _error_code(body: bytes) -> str | None:
    try:
        payload: Any = json.loads(body)
    except ValueError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        if code is not None:
            return str(code)
    return None


def _retry_after(value: str | None) -> float | None:
    """Seconds; an HTTP-date Retry-After is not summarized."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _queue_s(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        milliseconds = float(value)
    except ValueError:
        return None
    return milliseconds / 1000 if milliseconds >= 0 else None
