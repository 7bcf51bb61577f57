"""Usage accounting config: how a response's real token usage reaches the ext_proc servers.

Two ways, chosen per request by the admission stage (it knows whether the client asked
for a stream, the endpoint and how long the answer may be: filters/admission/stream.py,
`small_json_answer`):

- A small JSON answer: Envoy's json_to_metadata filter reads the `usage` members of the
  response body into dynamic metadata (namespace wire.USAGE_METADATA_NAMESPACE), and a
  gRPC access log sends them, with the reservation the admission stage wrote, to the
  ext_proc servers once the response is done. The access log batches entries on one
  long-lived stream, so the answer costs no gRPC stream of its own (ext_proc CPU per
  admitted request 2,249 -> 1,241 µs: benchmarks/RESULTS.md, "Usage by access log:
  before and after").
- A stream or a large JSON answer: the usage observer (an ext_proc filter in
  observability mode) reads the SSE events or the body as they pass, in Python: for a
  stream the final usage chunk or, without one, a count of content chunks, neither of
  which fits in metadata.

The admission stage says which per request in wire.USAGE_HEADER ("log", "observer" or
"none": nothing reserved, nobody reads), and each filter is wrapped in a matcher that
skips it unless it is the reader. json_to_metadata must not run on answers the observer
reads: it would parse them whole in Envoy's worker for nothing (about 40 ms a MB).
Routes strip the header before a provider sees it.
"""

from __future__ import annotations

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import base_pb2, config_source_pb2, grpc_service_pb2
from envoy.extensions.access_loggers.grpc.v3 import als_pb2
from envoy.extensions.filters.http.json_to_metadata.v3 import json_to_metadata_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import metadata_pb2, regex_pb2, string_pb2, value_pb2
from google.protobuf import any_pb2, wrappers_pb2
from xds.type.matcher.v3 import matcher_pb2

from sluicegate import wire
from sluicegate.model import Limits

from ._ext_proc import usage_observer_config
from ._proto import duration_ms, filter_with_matcher, pack, request_header_tree, skip_filter

# A second ext_proc instance needs its own filter name (the extension is chosen by type).
USAGE_FILTER = "sluicegate.usage_observer"
JSON_TO_METADATA_FILTER = "envoy.filters.http.json_to_metadata"
GRPC_ACCESS_LOG = "envoy.access_loggers.http_grpc"
# How long Envoy may hold finished requests' entries before sending them: a JSON answer's
# reservation is reconciled at most this long after its response ended.
LOG_FLUSH_MS = 100


def usage_filters(limits: Limits) -> list[hcm_pb2.HttpFilter]:
    """The observer, then json_to_metadata, each skipped where the admission stage says."""
    observer = pack(usage_observer_config(limits))
    return [
        _skipped_for(USAGE_FILTER, observer, (wire.USAGE_BY_LOG, wire.USAGE_UNREAD)),
        _skipped_for(
            JSON_TO_METADATA_FILTER,
            _usage_to_metadata(),
            (wire.USAGE_BY_OBSERVER, wire.USAGE_UNREAD),
        ),
    ]


def _skipped_for(name: str, config: any_pb2.Any, values: tuple[str, ...]) -> hcm_pb2.HttpFilter:
    """The filter `name`, skipped for a request whose wire.USAGE_HEADER is one of `values`."""
    tree = request_header_tree(wire.USAGE_HEADER)
    for value in values:
        tree.exact_match_map.map[value].CopyFrom(skip_filter())
    # No match (another value, or none): no action, so the filter runs.
    return filter_with_matcher(name, config, matcher_pb2.Matcher(matcher_tree=tree))


def _usage_to_metadata() -> any_pb2.Any:
    """`usage.<member>` of a JSON response body into wire.USAGE_METADATA_NAMESPACE.

    Values keep their JSON type (PROTOBUF_VALUE): the ext_proc side takes only whole
    numbers in range, as it does when it parses a body itself. Bodies of a JSON media type
    with any parameters (`application/json; charset=utf-8` is aiohttp's default) or none
    are read, as the observer reads them; others pass untouched, unbuffered. (The filter's
    default, the exact string `application/json`, charged such answers their estimate.)
    """
    rules = [
        json_to_metadata_pb2.JsonToMetadata.Rule(
            selectors=[
                json_to_metadata_pb2.JsonToMetadata.Selector(key="usage"),
                json_to_metadata_pb2.JsonToMetadata.Selector(key=member),
            ],
            on_present=json_to_metadata_pb2.JsonToMetadata.KeyValuePair(
                metadata_namespace=wire.USAGE_METADATA_NAMESPACE, key=member
            ),
        )
        for member in wire.USAGE_MEMBERS
    ]
    return pack(
        json_to_metadata_pb2.JsonToMetadata(
            response_rules=json_to_metadata_pb2.JsonToMetadata.MatchRules(
                rules=rules,
                allow_content_types_regex=regex_pb2.RegexMatcher(regex=wire.JSON_MEDIA_TYPE_REGEX),
                allow_empty_content_type=True,
            )
        )
    )


def usage_access_log() -> accesslog_pb2.AccessLog:
    """Over gRPC to the ext_proc servers' AccessLogService, batched every LOG_FLUSH_MS,
    the entries of requests whose usage nobody else reports, so each reservation is
    charged once: those the admission stage marked (wire.META_USAGE_VIA), and those with
    a reservation that never got a response (status 0: the client left first), which the
    observer never sees. The observer charges the rest and skips marked ones."""
    marked = accesslog_pb2.AccessLogFilter(
        metadata_filter=accesslog_pb2.MetadataFilter(
            matcher=metadata_pb2.MetadataMatcher(
                filter=wire.METADATA_NAMESPACE,
                path=[metadata_pb2.MetadataMatcher.PathSegment(key=wire.META_USAGE_VIA)],
                value=value_pb2.ValueMatcher(
                    string_match=string_pb2.StringMatcher(exact=wire.USAGE_VIA_LOG)
                ),
            ),
            # Envoy's default logs a request that lacks the key: every stream then was
            # charged twice (by the observer and by this log, as its estimate).
            match_if_key_not_found=wrappers_pb2.BoolValue(value=False),
        )
    )
    reserved = accesslog_pb2.AccessLogFilter(
        metadata_filter=accesslog_pb2.MetadataFilter(
            matcher=metadata_pb2.MetadataMatcher(
                filter=wire.METADATA_NAMESPACE,
                path=[metadata_pb2.MetadataMatcher.PathSegment(key=wire.META_RESERVATION)],
                value=value_pb2.ValueMatcher(present_match=True),
            ),
            match_if_key_not_found=wrappers_pb2.BoolValue(value=False),
        )
    )
    unanswered = accesslog_pb2.AccessLogFilter(
        status_code_filter=accesslog_pb2.StatusCodeFilter(
            comparison=accesslog_pb2.ComparisonFilter(
                op=accesslog_pb2.ComparisonFilter.EQ,
                # The runtime key is never set; it only satisfies the API.
                value=base_pb2.RuntimeUInt32(
                    default_value=0, runtime_key="sluicegate.usage_log.unanswered"
                ),
            )
        )
    )
    config = als_pb2.HttpGrpcAccessLogConfig(
        common_config=als_pb2.CommonGrpcAccessLogConfig(
            log_name=wire.USAGE_LOG_NAME,
            grpc_service=grpc_service_pb2.GrpcService(
                envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(
                    cluster_name=wire.EXT_PROC_SIDE_CLUSTER
                )
            ),
            transport_api_version=config_source_pb2.V3,
            buffer_flush_interval=duration_ms(LOG_FLUSH_MS),
        )
    )
    return accesslog_pb2.AccessLog(
        name=GRPC_ACCESS_LOG,
        filter=accesslog_pb2.AccessLogFilter(
            or_filter=accesslog_pb2.OrFilter(
                filters=[
                    marked,
                    accesslog_pb2.AccessLogFilter(
                        and_filter=accesslog_pb2.AndFilter(filters=[reserved, unanswered])
                    ),
                ]
            )
        ),
        typed_config=pack(config),
    )
