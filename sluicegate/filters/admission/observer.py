"""The usage stage: real token usage read off a large JSON answer, to reconcile its
reservation.

Envoy runs this filter in observability mode: it sends the response headers and every
body chunk and never waits for an answer. It runs only for answers the routing stage
gave it (wire.USAGE_BY_OBSERVER: a large JSON answer with a reservation, which Envoy
would parse whole in its worker); every other request's usage comes with its request
record, read by Envoy (filters/usage_reader.py). The admission stage's dynamic metadata
(reservation id, tenant, model, estimates) arrives with every message. What is charged:
charge.py.
"""

from __future__ import annotations

from typing import Any

from ..headers import header_text
from ..usage import SseUsageParser, UsageParser, usage_parser
from .charge import Reserved, charge, charged_by_observer, provider_usage, reserved_from
from .controller import AdmissionController


class UsageStream:
    """One response as the observer sees it."""

    __slots__ = (
        "_controller",
        "_finished",
        "_headers_seen",
        "_parser",
        "_reserved",
        "_status",
        "_streaming",
    )

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller
        self._reserved: Reserved | None = None
        self._status = 0
        self._streaming = False
        self._parser: UsageParser | None = None
        self._finished = False
        self._headers_seen = False

    @property
    def done(self) -> bool:
        """Nothing more to read: charged, or the response's headers showed nobody here has
        to charge it. The server then ends the call itself (service.py), so Envoy's
        observability-mode stream closes instead of being reset when its deferred close
        times out (a reset costs grpcio native memory: envoy/bootstrap.py)."""
        return self._finished or (self._headers_seen and self._reserved is None)

    def on_message(self, request: Any) -> None:
        kind = request.WhichOneof("request")
        if kind == "response_headers":
            self._on_headers(request)
        elif kind == "response_body" and self._parser is not None:
            self._parser.feed(request.response_body.body)
            if request.response_body.end_of_stream:
                self.finish()

    def _on_headers(self, request: Any) -> None:
        self._headers_seen = True
        filter_metadata = request.metadata_context.filter_metadata
        if not charged_by_observer(filter_metadata):
            return  # one report per request: its record charges this one
        self._reserved = reserved_from(filter_metadata)
        if self._reserved is None:
            return
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
        """Charge what the response used (charge.py); runs once, also when the response
        was cut before its end."""
        if self._finished or self._reserved is None:
            return
        self._finished = True
        seen = self._parser.finish() if self._parser is not None else None
        charge(
            self._controller,
            self._reserved,
            status=self._status,
            used=None if seen is None else provider_usage(seen.input_tokens, seen.output_tokens),
            counted=seen.content_chunks if seen is not None and self._streaming else None,
        )
