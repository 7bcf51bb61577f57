"""The usage stage: real token usage read off each response, to reconcile reservations.

Envoy runs this filter in observability mode: it sends the response headers and every
body chunk and never waits for an answer, so Python is not on the streaming path. The
admission stage's dynamic metadata (reservation id, tenant, model, estimates) arrives
with every message.

What is charged when the response ends (or is cut):
- the provider's `usage` (JSON body, or the final SSE chunk when the client asked for
  `stream_options.include_usage`): exactly that;
- a stream without usage: the estimated prompt tokens and one output token per content
  chunk (OpenAI-compatible servers send about one token per chunk). The request is left
  as the client sent it: adding include_usage upstream would need the extra chunk cut
  out of the stream, which puts Python on every chunk;
- a JSON body without usage: the estimate stays charged;
- an error status (4xx/5xx from the provider or from Envoy) without usage: nothing (the
  reservation is refunded: providers do not bill failed requests).
"""

from __future__ import annotations

from typing import Any, Final

from sluicegate import wire

from ..headers import header_text
from ..limiter import Usage
from ..usage import SseUsageParser, UsageParser, usage_parser
from .controller import AdmissionController

SOURCE_PROVIDER: Final = "provider"
SOURCE_COUNTED: Final = "counted"
SOURCE_ESTIMATE: Final = "estimate"
SOURCE_ERROR: Final = "error"


def _int(fields: Any, key: str) -> int:
    if key not in fields:
        return 0
    try:
        return max(0, int(fields[key].string_value))
    except ValueError:
        return 0


class UsageStream:
    """One response as the observer sees it."""

    __slots__ = (
        "_controller",
        "_estimate",
        "_finished",
        "_model",
        "_parser",
        "_reservation",
        "_status",
        "_streaming",
        "_tenant",
    )

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller
        self._reservation: str | None = None
        self._tenant = "anonymous"
        self._model = ""
        self._estimate = Usage(0, 0)
        self._status = 0
        self._streaming = False
        self._parser: UsageParser | None = None
        self._finished = False

    def on_message(self, request: Any) -> None:
        kind = request.WhichOneof("request")
        if kind == "response_headers":
            self._on_headers(request)
        elif kind == "response_body" and self._parser is not None:
            self._parser.feed(request.response_body.body)
            if request.response_body.end_of_stream:
                self.finish()

    def _on_headers(self, request: Any) -> None:
        filter_metadata = request.metadata_context.filter_metadata
        if wire.METADATA_NAMESPACE not in filter_metadata:
            return
        fields = filter_metadata[wire.METADATA_NAMESPACE].fields
        if wire.META_RESERVATION not in fields:
            return
        self._reservation = fields[wire.META_RESERVATION].string_value
        if wire.META_TENANT in fields:
            self._tenant = fields[wire.META_TENANT].string_value
        if wire.META_MODEL in fields:
            self._model = fields[wire.META_MODEL].string_value
        self._estimate = Usage(
            _int(fields, wire.META_ESTIMATE_INPUT), _int(fields, wire.META_ESTIMATE_OUTPUT)
        )
        content_type = None
        for header in request.response_headers.headers.headers:
            if header.key == ":status":
                text = header_text(header)
                self._status = int(text) if text.isdigit() else 0
            elif header.key == "content-type":
                content_type = header_text(header)
        self._parser = usage_parser(content_type)
        # One reading of the media type, the parser's (SSE or not).
        self._streaming = isinstance(self._parser, SseUsageParser)
        if request.response_headers.end_of_stream:
            self.finish()

    def finish(self) -> None:
        """Charge what the response used (module docstring); runs once, also when the
        response was cut before its end."""
        if self._finished or self._reservation is None:
            return
        self._finished = True
        seen = self._parser.finish() if self._parser is not None else None
        if seen is not None and seen.input_tokens is not None and seen.output_tokens is not None:
            actual, source = Usage(seen.input_tokens, seen.output_tokens), SOURCE_PROVIDER
        elif self._status >= 400 or self._status == 0:
            actual, source = Usage(0, 0), SOURCE_ERROR
        elif self._streaming and seen is not None:
            actual = Usage(self._estimate.input_tokens, seen.content_chunks)
            source = SOURCE_COUNTED
        else:
            actual, source = self._estimate, SOURCE_ESTIMATE
        metrics = self._controller.metrics
        metrics.usage_source.labels(source).inc()
        metrics.tokens_charged.labels(self._tenant, self._model, "input").inc(actual.input_tokens)
        metrics.tokens_charged.labels(self._tenant, self._model, "output").inc(actual.output_tokens)
        estimated = self._estimate.input_tokens + self._estimate.output_tokens
        used = actual.input_tokens + actual.output_tokens
        if estimated > used:
            metrics.tokens_refunded.labels(self._tenant, self._model).inc(estimated - used)
        store = self._controller.store()
        self._controller.spawn(store.reconcile(self._reservation, actual))
