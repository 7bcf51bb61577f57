"""Attempt stage (upstream filter): per-provider rewrites after Envoy chose the host.

One gRPC stream per upstream attempt. Envoy sends the request headers (with the
attributes `xds.upstream_host_metadata` and `xds.route_metadata`), then the
buffered body. Headers must be sent (request_header_mode SEND): with SKIP the
upstream codec sends them before the body is processed.

Retries reuse one header map across attempts, so a `:path` or
`content-length` set for one provider is what the next attempt starts from,
and `request.path` then shows the rewritten path. The first attempt therefore
stores the client's path in dynamic metadata (namespace `sluicegate`, key
`original_path`) and every attempt computes its path from that. The body, in
contrast, is the client's original on every attempt; `content-length` is set
whenever it no longer matches the body that goes out.
"""

from __future__ import annotations

from typing import Any, Final

from sluicegate import wire

from . import counters as outcome
from . import errors
from .counters import Counters
from .headers import header_text
from .jsonbody import BodyError, decode_utf8, find_member
from .metadata import (
    META_ORIGINAL_PATH,
    NO_ENDPOINT_FACTS,
    NO_ROUTE_FACTS,
    EndpointFacts,
    MetadataError,
    RouteFacts,
    TextCache,
    parse_endpoint_facts,
    parse_route_facts,
    upstream_path,
)
from .responses import (
    CONTINUE_REQUEST_BODY,
    CONTINUE_REQUEST_HEADERS,
    PASS_THROUGH,
    common,
    namespace_struct,
    request_body_answer,
    request_headers_answer,
    set_header,
)

STAGE = wire.STAGE_ATTEMPT
# Attributes the attempt stage needs in ExternalProcessor.request_attributes.
ROUTE_METADATA_ATTRIBUTE: Final = "xds.route_metadata"
REQUEST_ATTRIBUTES: Final = (wire.UPSTREAM_HOST_METADATA_ATTRIBUTE, ROUTE_METADATA_ATTRIBUTE)
# Envoy files the attributes of an ext_proc filter under the filter's name.
ATTRIBUTES_KEY: Final = "envoy.filters.http.ext_proc"


class AttemptCaches:
    """Parsed metadata shared by all attempt streams of one server."""

    __slots__ = ("endpoints", "routes")

    def __init__(self) -> None:
        self.endpoints: TextCache[EndpointFacts] = TextCache(parse_endpoint_facts)
        self.routes: TextCache[RouteFacts] = TextCache(parse_route_facts)


class AttemptStream:
    """State of one attempt's stream: facts read from the headers, used on the body."""

    __slots__ = ("_caches", "_content_length", "_counters", "_endpoint")

    _caches: AttemptCaches
    _counters: Counters
    _endpoint: EndpointFacts
    _content_length: str | None

    def __init__(self, caches: AttemptCaches, counters: Counters) -> None:
        self._caches = caches
        self._counters = counters
        self._endpoint = NO_ENDPOINT_FACTS
        self._content_length = None

    def on_message(self, request: Any) -> bytes:
        kind = request.WhichOneof("request")
        if kind == "request_headers":
            return self._on_headers(request)
        if kind == "request_body":
            return self._on_body(request.request_body.body)
        return PASS_THROUGH.get(kind or "", CONTINUE_REQUEST_HEADERS)

    def _on_headers(self, request: Any) -> bytes:
        route = NO_ROUTE_FACTS
        if ATTRIBUTES_KEY in request.attributes:
            fields = request.attributes[ATTRIBUTES_KEY].fields
            try:
                if wire.UPSTREAM_HOST_METADATA_ATTRIBUTE in fields:
                    text = fields[wire.UPSTREAM_HOST_METADATA_ATTRIBUTE].string_value
                    self._endpoint = self._caches.endpoints.get(text)
                if ROUTE_METADATA_ATTRIBUTE in fields:
                    route = self._caches.routes.get(fields[ROUTE_METADATA_ATTRIBUTE].string_value)
            except MetadataError:
                self._counters.inc(STAGE, outcome.BAD_METADATA)
                return errors.BAD_UPSTREAM_METADATA
        endpoint = self._endpoint

        path = ""
        for header in request.request_headers.headers.headers:
            key = header.key
            if key == ":path":
                path = header_text(header)
            elif key == "content-length":
                self._content_length = header_text(header)

        original: str | None = None
        metadata = request.metadata_context.filter_metadata
        if wire.METADATA_NAMESPACE in metadata:
            fields = metadata[wire.METADATA_NAMESPACE].fields
            if META_ORIGINAL_PATH in fields:
                original = fields[META_ORIGINAL_PATH].string_value
        remember = None
        if original is None:
            original = path
            if endpoint.path_prefix is not None:
                remember = namespace_struct(wire.METADATA_NAMESPACE, {META_ORIGINAL_PATH: original})

        mutations: list[Any] = []
        target = upstream_path(original, route.path_prefix, endpoint.path_prefix)
        if target != path and target:
            mutations.append(set_header(":path", target.encode("utf-8", "surrogateescape")))
        if request.request_headers.end_of_stream:
            self._counters.inc(STAGE, outcome.FORWARDED)
        if not mutations and remember is None:
            return CONTINUE_REQUEST_HEADERS
        return request_headers_answer(common(mutations), remember)

    def _on_body(self, body: bytes) -> bytes:
        model_json = self._endpoint.model_json
        new_body: bytes | None = None
        if model_json:
            try:
                text = decode_utf8(body)
                member = find_member(text, "model")
            except BodyError as exc:
                self._counters.inc(STAGE, outcome.BAD_REQUEST)
                return errors.BODY_PROBLEMS[exc.problem]
            if member is not None and isinstance(member.value, str):
                replacement = model_json.get(member.value)
                if replacement is not None:
                    new_body = (text[: member.start] + replacement + text[member.end :]).encode(
                        "utf-8"
                    )
        if new_body is None:
            self._counters.inc(STAGE, outcome.FORWARDED)
            length = str(len(body))
            if self._content_length is None or self._content_length == length:
                return CONTINUE_REQUEST_BODY
            # A previous attempt changed content-length on the shared header map.
            return request_body_answer(common([set_header("content-length", length.encode())]))
        self._counters.inc(STAGE, outcome.REWRITTEN)
        return request_body_answer(
            common([set_header("content-length", str(len(new_body)).encode())], new_body)
        )
