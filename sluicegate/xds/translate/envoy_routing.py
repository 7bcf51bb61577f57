"""Routing without Python (`admission.lane: fast` with nothing to admit; docs/fast-lane.md).

No routing stage runs: Envoy reads the body's `model` and `stream` itself and picks the
model route, so a request opens no ext_proc stream.

- `json_to_metadata` (request rules) writes `model` (a string) and `stream` (as the body
  has it) into the `sluicegate` namespace, where the routing stage would write them, so
  the request record reads them as ever; a body that is not JSON, or has no `model`,
  writes wire.META_ERROR_CODE instead. The filter clears the route cache, and the
  request re-matches on that metadata.
- Per model, three routes (first match wins): the stream twin (metadata `stream` is
  `true`), the text generation endpoints (chat, completions, responses), then the rest
  of the prefix (embeddings …). Each names the usage reader for its answers in
  wire.USAGE_HEADER through a `header_mutation` filter's per-route config (a filter's own
  per-route config follows the route the body selected): `stream`, `log`, `none`, as the
  routing stage would, so the same readers run (usage.py). What differs: no usage event
  is asked for a stream whose client did not ask (Envoy would have to rewrite the body),
  and a long JSON answer is read as a short one (the output cap is not read).
- Per prefix, after every model route: a body error answered 400 (its code from the
  metadata), a model no route serves 404; both OpenAI JSON from Envoy itself.
"""

from __future__ import annotations

import re
from typing import Final

from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.http.json_to_metadata.v3 import json_to_metadata_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import metadata_pb2, regex_pb2, string_pb2, value_pb2
from google.protobuf import struct_pb2

from sluicegate import wire
from sluicegate.local_replies import (
    BODY_ERRORS,
    INVALID_JSON_BODY,
    MISSING_MODEL_BODY,
    MODEL_NOT_SERVED,
    BodyError,
)

from ._proto import pack
from .errors_json import error_body

MODEL_READER_FILTER: Final = "sluicegate.model_reader"
JSON_TO_METADATA_EXTENSION: Final = "envoy.filters.http.json_to_metadata"
READER_HEADER_FILTER: Final = "envoy.filters.http.header_mutation"
# Endpoints whose JSON answers carry `usage` (usage_reader.py reads the same ones).
GENERATION_ENDPOINTS: Final = ("chat/completions", "completions", "responses")
_JSON: Final = "application/json"


def routing_filters() -> list[hcm_pb2.HttpFilter]:
    """The model reader, then the filter that names the usage reader per route."""
    return [
        hcm_pb2.HttpFilter(
            name=MODEL_READER_FILTER,
            typed_config=pack(_model_reader()),
        ),
        hcm_pb2.HttpFilter(
            name=READER_HEADER_FILTER,
            typed_config=pack(header_mutation_pb2.HeaderMutation()),
        ),
    ]


def _meta(key: str, **value: object) -> json_to_metadata_pb2.JsonToMetadata.KeyValuePair:
    return json_to_metadata_pb2.JsonToMetadata.KeyValuePair(
        metadata_namespace=wire.METADATA_NAMESPACE, key=key, **value
    )


def _model_reader() -> json_to_metadata_pb2.JsonToMetadata:
    """`model` as a string (a number becomes its text, so it is a model no route serves)
    and `stream` as the body has it; every content type is read, as the routing stage
    reads every body (the listener's buffer limit bounds it: 413 above)."""
    rule = json_to_metadata_pb2.JsonToMetadata.Rule
    selector = json_to_metadata_pb2.JsonToMetadata.Selector
    error = wire.META_ERROR_CODE
    model = rule(
        selectors=[selector(key="model")],
        on_present=_meta(wire.META_MODEL, type=json_to_metadata_pb2.JsonToMetadata.STRING),
        on_missing=_meta(error, value=struct_pb2.Value(string_value=MISSING_MODEL_BODY.code)),
        on_error=_meta(error, value=struct_pb2.Value(string_value=INVALID_JSON_BODY.code)),
    )
    stream = rule(selectors=[selector(key="stream")], on_present=_meta(wire.META_STREAM))
    return json_to_metadata_pb2.JsonToMetadata(
        request_rules=json_to_metadata_pb2.JsonToMetadata.MatchRules(
            rules=[model, stream],
            allow_content_types_regex=regex_pb2.RegexMatcher(regex=".*"),
            allow_empty_content_type=True,
        )
    )


def _metadata_match(key: str, value: value_pb2.ValueMatcher) -> metadata_pb2.MetadataMatcher:
    return metadata_pb2.MetadataMatcher(
        filter=wire.METADATA_NAMESPACE,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key=key)],
        value=value,
    )


def _reader(reader: str) -> dict[str, object]:
    """The per-route config that names `reader` in wire.USAGE_HEADER."""
    header = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=wire.USAGE_HEADER, value=reader),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    mutations = header_mutation_pb2.Mutations(
        request_mutations=[mutation_rules_pb2.HeaderMutation(append=header)]
    )
    return {
        READER_HEADER_FILTER: pack(header_mutation_pb2.HeaderMutationPerRoute(mutations=mutations))
    }


def model_routes(plain: rc.Route, twin: rc.Route, model: str, prefix: str) -> list[rc.Route]:
    """A model's routes matched on the metadata the model reader wrote: `twin` (the stream
    twin) and `plain` with their header matches replaced (streams.py)."""
    exact = value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=model))
    by_model = _metadata_match(wire.META_MODEL, exact)
    streamed = _metadata_match(wire.META_STREAM, value_pb2.ValueMatcher(bool_match=True))
    generation = "|".join(re.escape(endpoint) for endpoint in GENERATION_ENDPOINTS)
    variants = (
        (twin, [by_model, streamed], None, wire.USAGE_BY_STREAM),
        (plain, [by_model], f"{re.escape(prefix)}({generation})", wire.USAGE_BY_LOG),
        (plain, [by_model], None, wire.USAGE_UNREAD),
    )
    routes = []
    for base, matches, path_regex, reader in variants:
        route = rc.Route()
        route.CopyFrom(base)
        route.match.ClearField("headers")
        route.request_headers_to_remove[:] = []
        if path_regex is not None:
            route.match.safe_regex.regex = path_regex
        route.match.dynamic_metadata.extend(matches)
        for name, config in _reader(reader).items():
            route.typed_per_filter_config[name].CopyFrom(config)
        routes.append(route)
    return routes


def answered_routes(prefix: str) -> list[rc.Route]:
    """Under `prefix`, after every model route: each body error, then a model no route
    serves."""
    routes = [
        _json_reply(
            prefix,
            error,
            _metadata_match(
                wire.META_ERROR_CODE,
                value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=error.code)),
            ),
        )
        for error in BODY_ERRORS
    ]
    served = _metadata_match(wire.META_MODEL, value_pb2.ValueMatcher(present_match=True))
    routes.append(_json_reply(prefix, MODEL_NOT_SERVED, served))
    return routes


def _json_reply(prefix: str, error: BodyError, match: metadata_pb2.MetadataMatcher) -> rc.Route:
    body = error_body(error.message, "invalid_request_error", error.code, error.param)
    return rc.Route(
        name=f"answered-{error.code}",
        match=rc.RouteMatch(prefix=prefix, dynamic_metadata=[match]),
        direct_response=rc.DirectResponseAction(
            status=error.status, body=base_pb2.DataSource(inline_string=body.decode())
        ),
        # The JSON pass-through mapper of local_reply_config knows it by this header.
        response_headers_to_add=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="content-type", value=_JSON),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        ],
    )
