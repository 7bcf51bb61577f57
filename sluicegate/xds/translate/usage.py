"""Usage accounting config: how a response's real token usage is read.

The routing stage says who reads it, per request, in wire.USAGE_HEADER (it knows whether
the client asked for a stream, the endpoint and how long the answer may be:
filters/usage_reader.py), and each reader is wrapped in a matcher that skips it for the
other values:

- A small JSON answer (USAGE_BY_LOG): Envoy's json_to_metadata filter reads the `usage`
  members of the body into dynamic metadata (wire.USAGE_METADATA_NAMESPACE).
- An event stream (USAGE_BY_STREAM, USAGE_BY_STREAM_CHUNKS): sse_to_metadata, and for
  the second a Lua filter that reads its chunks (stream_usage.py), in Envoy.
- A large JSON answer with a reservation (USAGE_BY_OBSERVER): the usage observer, an
  ext_proc filter in observability mode, parses it in Python (Envoy would parse it whole
  in its worker, about 40 ms a MB). Only with token limits.

The first two reach the ext_proc servers in the request record (record_log.py), which
also charges their reservations (docs/admission.md, "Reserve, then reconcile"). Routes
strip the header before a provider sees it. With sluicegate's native filters (native.py),
one filter of its library reads the first two kinds in place of Envoy's three.
"""

from __future__ import annotations

from envoy.extensions.filters.http.json_to_metadata.v3 import json_to_metadata_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import regex_pb2
from google.protobuf import any_pb2
from xds.type.matcher.v3 import matcher_pb2

from sluicegate import wire
from sluicegate.model import Limits

from ._ext_proc import usage_observer_config
from ._proto import filter_with_matcher, pack, request_header_tree, skip_filter
from .native import native_usage_reader
from .stream_usage import (
    LUA_FILTER,
    SSE_TO_METADATA_FILTER,
    sse_to_metadata_config,
    stream_usage_lua_config,
)

# A second ext_proc instance needs its own filter name (the extension is chosen by type).
USAGE_FILTER = "sluicegate.usage_observer"
JSON_TO_METADATA_FILTER = "envoy.filters.http.json_to_metadata"
STREAM_USAGE_FILTER = "sluicegate.stream_usage"


def usage_filters(
    limits: Limits, *, counts_tokens: bool, native_module: str | None = None
) -> list[hcm_pb2.HttpFilter]:
    """Each reader, run only for the requests the routing stage gave it; the observer only
    where token limits exist. The Lua filter comes before sse_to_metadata (stream_usage.py
    says why). With a `native_module`, its usage reader in place of Envoy's three
    (native.py)."""
    filters = []
    if counts_tokens:
        observer = pack(usage_observer_config(limits))
        filters.append(_only_for(USAGE_FILTER, observer, (wire.USAGE_BY_OBSERVER,)))
    if native_module is not None:
        return [*filters, native_usage_reader(native_module)]
    streams = (wire.USAGE_BY_STREAM, wire.USAGE_BY_STREAM_CHUNKS)
    filters += [
        _only_for(JSON_TO_METADATA_FILTER, _usage_to_metadata(), (wire.USAGE_BY_LOG,)),
        _only_for(
            STREAM_USAGE_FILTER,
            stream_usage_lua_config(),
            (wire.USAGE_BY_STREAM_CHUNKS,),
            LUA_FILTER,
        ),
        _only_for(SSE_TO_METADATA_FILTER, sse_to_metadata_config(), streams),
    ]
    return filters


def _only_for(
    name: str, config: any_pb2.Any, readers: tuple[str, ...], extension: str | None = None
) -> hcm_pb2.HttpFilter:
    """The filter `name`, skipped for a request whose wire.USAGE_HEADER names a reader not
    in `readers`. Without the header (an answer Envoy made itself, which no routing stage
    saw) or with a value this config does not know (a newer routing stage) it runs: each
    reader passes over what is not its media type."""
    tree = request_header_tree(wire.USAGE_HEADER)
    for value in wire.USAGE_READERS:
        if value not in readers:
            tree.exact_match_map.map[value].CopyFrom(skip_filter())
    return filter_with_matcher(name, config, matcher_pb2.Matcher(matcher_tree=tree), extension)


def _usage_to_metadata() -> any_pb2.Any:
    """`usage.<member>` of a JSON response body into wire.USAGE_METADATA_NAMESPACE.

    Values keep their JSON type (PROTOBUF_VALUE): the record takes only whole numbers in
    range, as the ext_proc side does when it parses a body itself, except that it cannot
    tell a number sent as text ("12") from the number (docs/metrics.md, "The record").
    Bodies of a JSON media type with any parameters (`application/json; charset=utf-8`
    is aiohttp's default) or none are read, as the observer reads them; others pass
    untouched, unbuffered. (The filter's default, the exact string `application/json`,
    charged such answers their estimate.)
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
