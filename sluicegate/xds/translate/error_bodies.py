"""A provider's error answer that is not JSON becomes OpenAI's error JSON.

Clients parse `{"error": {...}}` on every non-2xx answer, but a provider may answer an
error in plain text (a proxy's 400, an HTML 502 page). local_reply_config cannot touch
upstream answers, so an ext_proc filter (stage wire.STAGE_ERROR_BODY) wraps the body,
keeping the status and the provider's text. Envoy's composite filter creates that filter
only for an answer whose response headers match (a 4xx/5xx status and a content type that
is not JSON, wire.JSON_MEDIA_TYPE_REGEX), evaluated per response in C++: a 2xx answer, a
stream and any JSON error (the gateway's own local replies included) never reach Python,
nor is an ext_proc filter made for them (the composite filter itself is far cheaper than
an ext_proc filter skipped per request, which every request paid before:
benchmarks/RESULTS.md, "The error-body filter only for errors"); an error answer that
is wrapped costs one buffered round trip (errors are small).
"""

from __future__ import annotations

from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import http_inputs_pb2
from xds.core.v3 import extension_pb2 as xds_extension_pb2
from xds.type.matcher.v3 import matcher_pb2, regex_pb2, string_pb2

from sluicegate import wire
from sluicegate.model import Limits

from ._ext_proc import error_body_config
from ._proto import Predicate, composite_filter, not_predicate, pack

ERROR_BODY_FILTER = "sluicegate.error_body"
# The composite filter's action that runs the wrapping filter.
ERROR_BODY_ACTION = "sluicegate.error_body.wrap"
RESPONSE_HEADER_INPUT = "envoy.matching.inputs.response_headers"
# Statuses that are not errors: no wrapping filter is made for them.
NOT_AN_ERROR_STATUS = r"[123][0-9][0-9]"


def _header_matches(header: str, regex: str) -> matcher_pb2.Matcher.MatcherList.Predicate:
    return matcher_pb2.Matcher.MatcherList.Predicate(
        single_predicate=matcher_pb2.Matcher.MatcherList.Predicate.SinglePredicate(
            input=xds_extension_pb2.TypedExtensionConfig(
                name=RESPONSE_HEADER_INPUT,
                typed_config=pack(http_inputs_pb2.HttpResponseHeaderMatchInput(header_name=header)),
            ),
            value_match=string_pb2.StringMatcher(
                safe_regex=regex_pb2.RegexMatcher(
                    # xds's matcher API requires the engine; Envoy's own does not.
                    google_re2=regex_pb2.RegexMatcher.GoogleRE2(),
                    regex=regex,
                )
            ),
        )
    )


def error_body_filter(limits: Limits) -> hcm_pb2.HttpFilter:
    """The composite filter that runs the wrapping filter for an error that is not JSON
    (module doc). A missing content-type does not match JSON, so an error without one is
    wrapped."""
    error_not_json = Predicate(
        and_matcher=Predicate.PredicateList(
            predicate=[
                not_predicate(_header_matches(":status", NOT_AN_ERROR_STATUS)),
                not_predicate(_header_matches("content-type", wire.JSON_MEDIA_TYPE_REGEX)),
            ]
        )
    )
    return composite_filter(
        ERROR_BODY_FILTER, pack(error_body_config(limits)), ERROR_BODY_ACTION, error_not_json
    )
