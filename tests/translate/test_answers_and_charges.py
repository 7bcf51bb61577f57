"""Translation rules behind issue 9, parts 3 and 4 (the e2e tests in tests/e2e/
test_hostile_input.py and tests/admission/test_charge_once.py show the behaviour):
Envoy's header limits leave room for the gateway's own headers, a local 501 is a 400,
a provider's non-JSON error goes to the error-body stage and nothing else does, and each
usage reader runs only for the requests the routing stage gives it."""

from __future__ import annotations

import re

from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.common.matching.v3 import extension_matcher_pb2
from envoy.extensions.filters.http.composite.v3 import composite_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.http.json_to_metadata.v3 import json_to_metadata_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from sluicegate import wire
from sluicegate.xds.translate import LISTENER, translate

from .cases import model_of


def hcm(case: str) -> hcm_pb2.HttpConnectionManager:
    (listener,) = translate(model_of(case))[LISTENER]
    assert isinstance(listener, listener_pb2.Listener)
    result = hcm_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[-1].typed_config.Unpack(result)
    return result


def test_envoys_header_limits_are_the_clients_plus_the_headroom() -> None:
    manager = hcm("single_provider")
    count = manager.common_http_protocol_options.max_headers_count.value
    assert count == wire.MAX_REQUEST_HEADERS + wire.REQUEST_HEADERS_HEADROOM
    size_kb = manager.max_request_headers_kb.value
    assert size_kb == wire.MAX_REQUEST_HEADERS_KB + wire.REQUEST_HEADERS_HEADROOM_KB


def test_a_local_501_is_answered_as_a_400() -> None:
    mappers = hcm("single_provider").local_reply_config.mappers
    (mapper,) = [
        m for m in mappers if m.filter.status_code_filter.comparison.value.default_value == 501
    ]
    assert mapper.status_code.value == 400
    code = mapper.body_format_override.json_format.fields["error"].struct_value.fields["code"]
    assert code.string_value == "unsupported_request"


def test_the_error_body_stage_runs_last_before_the_router_and_only_on_non_json_errors() -> None:
    filters = hcm("single_provider").http_filters
    assert [f.name for f in filters][-2:] == ["sluicegate.error_body", "envoy.filters.http.router"]
    wrapper = extension_matcher_pb2.ExtensionWithMatcher()
    assert filters[-2].typed_config.Unpack(wrapper)
    # A composite filter: the ext_proc filter is made only for a response that matches.
    assert wrapper.extension_config.name == "envoy.filters.http.composite"
    (wrapped,) = wrapper.xds_matcher.matcher_list.matchers
    action = composite_pb2.ExecuteFilterAction()
    assert wrapped.on_match.action.typed_config.Unpack(action)
    processor = ext_proc_pb2.ExternalProcessor()
    assert action.typed_config.typed_config.Unpack(processor)
    assert processor.failure_mode_allow
    assert processor.grpc_service.initial_metadata[0].value == wire.STAGE_ERROR_BODY
    regexes = [
        p.not_matcher.single_predicate.value_match.safe_regex.regex
        for p in wrapped.predicate.and_matcher.predicate
    ]
    # The regexes are RE2; these simple ones read the same in Python.
    status, content_type = (re.compile(r) for r in regexes)
    assert all(status.fullmatch(s) for s in ("200", "204", "304"))
    assert not any(status.fullmatch(s) for s in ("400", "429", "502"))
    for json_type in ("application/json", "application/json; charset=utf-8", "Application/JSON",
                      "application/problem+json"):  # fmt: skip
        assert content_type.fullmatch(json_type)
    for other in ("text/plain", "text/html; charset=utf-8", "application/jsonl", ""):
        assert not content_type.fullmatch(other)
    assert not wrapper.xds_matcher.HasField("on_no_match")  # otherwise: nothing runs


def test_json_answers_with_parameters_have_their_usage_read() -> None:
    for http_filter in hcm("token_limits").http_filters:
        if http_filter.name == "envoy.filters.http.json_to_metadata":
            wrapper = extension_matcher_pb2.ExtensionWithMatcher()
            assert http_filter.typed_config.Unpack(wrapper)
            config = json_to_metadata_pb2.JsonToMetadata()
            assert wrapper.extension_config.typed_config.Unpack(config)
            rules = config.response_rules
            assert rules.allow_content_types_regex.regex == wire.JSON_MEDIA_TYPE_REGEX
            assert rules.allow_empty_content_type
            return
    raise AssertionError("no json_to_metadata filter")


READERS = {
    "sluicegate.usage_observer": {wire.USAGE_BY_OBSERVER},
    "envoy.filters.http.json_to_metadata": {wire.USAGE_BY_LOG},
    "sluicegate.stream_usage": {wire.USAGE_BY_STREAM_CHUNKS},
    "envoy.filters.http.sse_to_metadata": {wire.USAGE_BY_STREAM, wire.USAGE_BY_STREAM_CHUNKS},
}


def test_each_usage_reader_runs_only_for_the_requests_given_it() -> None:
    """The routing stage names one reader per request (usage_reader.py); every filter not
    its is skipped: the Lua filter runs only on a stream whose chunks must be read. The Lua
    filter is listed before sse_to_metadata, so on the way back sse_to_metadata reads the
    usage event before the Lua filter cuts it."""
    filters = hcm("token_limits").http_filters
    names = [f.name for f in filters if f.name in READERS]
    assert names == list(READERS)
    for http_filter in filters:
        if http_filter.name not in READERS:
            continue
        wrapper = extension_matcher_pb2.ExtensionWithMatcher()
        assert http_filter.typed_config.Unpack(wrapper)
        skipped = dict(wrapper.xds_matcher.matcher_tree.exact_match_map.map)
        assert set(skipped) == set(wire.USAGE_READERS) - READERS[http_filter.name]
        assert not wrapper.xds_matcher.HasField("on_no_match")


def test_without_token_limits_usage_is_read_by_envoy_only() -> None:
    """Every request's usage reaches its record (metrics); the observer, Python, only
    where reservations exist."""
    names = [f.name for f in hcm("single_provider").http_filters if f.name in READERS]
    assert names == list(READERS)[1:]


def test_one_access_log_the_record() -> None:
    """Every request's record charges its reservation: no second log carries usage."""
    names = [log.name for log in hcm("token_limits").access_log]
    assert names == ["envoy.access_loggers.open_telemetry"]
