"""Routing without Python (`admission.lane: fast` with nothing to admit; docs/fast-lane.md).

No routing stage runs: Envoy's model reader (model_reader.py, a Lua filter) reads the
body's `model` and `stream` into the `sluicegate` metadata namespace, names the usage
reader in wire.USAGE_HEADER and clears the route cache; the request re-matches here:

- per model, its stream twin (metadata `stream` is `true`) and its plain route, matched
  on metadata `model` instead of the routing stage's headers (streams.py);
- per prefix, after every model route: each body problem the reader found, answered 400
  as the routing stage words it, then a model no route serves, 404; OpenAI error JSON
  from Envoy itself (local_replies.BODY_REFUSALS, MODEL_NOT_SERVED).
"""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import metadata_pb2, string_pb2, value_pb2

from sluicegate import wire
from sluicegate.local_replies import (
    BODY_REFUSALS,
    MODEL_NOT_SERVED,
    BodyRefusal,
    answered_route_name,
)

from .errors_json import error_body, json_reply_headers
from .model_reader import META_BODY_PROBLEM, MODEL_READER_FILTER, model_reader_config


def routing_filters(default_max_tokens: int) -> list[hcm_pb2.HttpFilter]:
    """The model reader, in place of the routing stage."""
    return [
        hcm_pb2.HttpFilter(
            name=MODEL_READER_FILTER,
            typed_config=model_reader_config(default_max_tokens),
        )
    ]


def _metadata_match(key: str, value: value_pb2.ValueMatcher) -> metadata_pb2.MetadataMatcher:
    return metadata_pb2.MetadataMatcher(
        filter=wire.METADATA_NAMESPACE,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key=key)],
        value=value,
    )


def model_routes(plain: rc.Route, twin: rc.Route, model: str) -> list[rc.Route]:
    """A model's stream twin and plain route (streams.py) matched on the metadata the model
    reader wrote instead of the routing stage's headers."""
    exact = value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=model))
    by_model = _metadata_match(wire.META_MODEL, exact)
    streamed = _metadata_match(wire.META_STREAM, value_pb2.ValueMatcher(bool_match=True))
    routes = []
    for base, matches in ((twin, [by_model, streamed]), (plain, [by_model])):
        route = rc.Route()
        route.CopyFrom(base)
        route.match.ClearField("headers")
        del route.request_headers_to_remove[:]
        route.match.dynamic_metadata.extend(matches)
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
                META_BODY_PROBLEM,
                value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=error.problem)),
            ),
        )
        for error in BODY_REFUSALS
    ]
    served = _metadata_match(wire.META_MODEL, value_pb2.ValueMatcher(present_match=True))
    routes.append(_json_reply(prefix, MODEL_NOT_SERVED, served))
    return routes


def _json_reply(prefix: str, error: BodyRefusal, match: metadata_pb2.MetadataMatcher) -> rc.Route:
    body = error_body(error.message, "invalid_request_error", error.code, error.param)
    return rc.Route(
        name=answered_route_name(error),
        match=rc.RouteMatch(prefix=prefix, dynamic_metadata=[match]),
        direct_response=rc.DirectResponseAction(
            status=error.status, body=base_pb2.DataSource(inline_string=body.decode())
        ),
        response_headers_to_add=json_reply_headers(),
    )
