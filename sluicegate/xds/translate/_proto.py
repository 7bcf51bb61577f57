"""Small protobuf helpers shared by the translate modules (private to this room)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any as AnyValue

from envoy.config.core.v3 import base_pb2, config_source_pb2, extension_pb2
from envoy.extensions.common.matching.v3 import extension_matcher_pb2
from envoy.extensions.filters.common.matcher.action.v3 import skip_action_pb2
from envoy.extensions.filters.http.composite.v3 import composite_pb2
from envoy.extensions.filters.http.lua.v3 import lua_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import http_inputs_pb2
from google.protobuf import any_pb2, duration_pb2, struct_pb2
from google.protobuf.message import Message
from xds.core.v3 import extension_pb2 as xds_extension_pb2
from xds.type.matcher.v3 import matcher_pb2

from sluicegate import wire

REQUEST_HEADER_INPUT = "envoy.matching.inputs.request_headers"
SKIP_FILTER_ACTION = "envoy.filters.common.matcher.action.skip_filter"
COMPOSITE_FILTER = "envoy.filters.http.composite"


def lua(source: str) -> lua_pb2.Lua:
    """A Lua filter's configuration running `source`."""
    return lua_pb2.Lua(default_source_code=base_pb2.DataSource(inline_string=source))


def set_headers(*headers: tuple[str, str]) -> list[base_pb2.HeaderValueOption]:
    """Headers to set, each replacing any of the same name."""
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=key, value=value),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for key, value in headers
    ]


def ads_source() -> config_source_pb2.ConfigSource:
    """A resource served over the ADS stream the bootstrap opened (v3): every xDS
    reference sluicegate writes (RDS, EDS, SDS, ECDS)."""
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )


def request_header_tree(header_name: str) -> matcher_pb2.Matcher.MatcherTree:
    """An empty matcher tree on one request header's value (callers fill its map)."""
    return matcher_pb2.Matcher.MatcherTree(
        input=xds_extension_pb2.TypedExtensionConfig(
            name=REQUEST_HEADER_INPUT,
            typed_config=pack(http_inputs_pb2.HttpRequestHeaderMatchInput(header_name=header_name)),
        ),
    )


def skip_filter() -> matcher_pb2.Matcher.OnMatch:
    """The matcher action that skips the filter it wraps for this request."""
    return matcher_pb2.Matcher.OnMatch(
        action=xds_extension_pb2.TypedExtensionConfig(
            name=SKIP_FILTER_ACTION, typed_config=pack(skip_action_pb2.SkipFilter())
        )
    )


def filter_with_matcher(
    name: str, config: any_pb2.Any, matcher: matcher_pb2.Matcher, extension: str | None = None
) -> hcm_pb2.HttpFilter:
    """The HTTP filter `name` (typed `config`, extension name `extension`, default `name`),
    run, skipped or steered per request by `matcher`."""
    return hcm_pb2.HttpFilter(
        name=name,
        typed_config=pack(
            extension_matcher_pb2.ExtensionWithMatcher(
                xds_matcher=matcher,
                extension_config=extension_pb2.TypedExtensionConfig(
                    name=extension or name, typed_config=config
                ),
            )
        ),
    )


def per_provider_filter(
    name: str,
    runs: Mapping[str, tuple[str, extension_pb2.TypedExtensionConfig]],
    otherwise: matcher_pb2.Matcher.OnMatch | None = None,
) -> hcm_pb2.HttpFilter:
    """An upstream composite filter `name` that runs, per attempt, the filter the chosen
    provider needs: `runs` maps a provider name (the wire.PROVIDER_HEADER the first
    upstream filter sets from the host's metadata) to (action name, filter config);
    `otherwise` is for no match (None: nothing runs)."""
    tree = request_header_tree(wire.PROVIDER_HEADER)
    for provider, (action, config) in runs.items():
        tree.exact_match_map.map[provider].CopyFrom(execute_filter(action, config))
    matcher = matcher_pb2.Matcher(matcher_tree=tree)
    if otherwise is not None:
        matcher.on_no_match.CopyFrom(otherwise)
    return filter_with_matcher(name, pack(composite_pb2.Composite()), matcher, COMPOSITE_FILTER)


def execute_filter(
    action: str, config: extension_pb2.TypedExtensionConfig
) -> matcher_pb2.Matcher.OnMatch:
    """The composite filter's action: run the filter `config` for this request."""
    return matcher_pb2.Matcher.OnMatch(
        action=xds_extension_pb2.TypedExtensionConfig(
            name=action, typed_config=pack(composite_pb2.ExecuteFilterAction(typed_config=config))
        )
    )


Predicate = matcher_pb2.Matcher.MatcherList.Predicate


def composite_filter(
    name: str, config: any_pb2.Any, action: str, when: matcher_pb2.Matcher.MatcherList.Predicate
) -> hcm_pb2.HttpFilter:
    """Envoy's composite filter in the place of the filter `name` (typed `config`): it
    makes that filter, through its action named `action`, only for a request `when`
    holds, and nothing otherwise: far cheaper than a filter made for every request and
    skipped (benchmarks/RESULTS.md, "The error-body filter only for errors")."""
    run = execute_filter(action, extension_pb2.TypedExtensionConfig(name=name, typed_config=config))
    matcher = matcher_pb2.Matcher(
        matcher_list=matcher_pb2.Matcher.MatcherList(
            matchers=[matcher_pb2.Matcher.MatcherList.FieldMatcher(predicate=when, on_match=run)]
        )
    )
    return filter_with_matcher(name, pack(composite_pb2.Composite()), matcher, COMPOSITE_FILTER)


def not_predicate(
    predicate: matcher_pb2.Matcher.MatcherList.Predicate,
) -> matcher_pb2.Matcher.MatcherList.Predicate:
    return matcher_pb2.Matcher.MatcherList.Predicate(not_matcher=predicate)


def pack(message: Message) -> any_pb2.Any:
    """Wrap a typed config in `google.protobuf.Any`, as every Envoy extension slot wants.

    Deterministic, so map fields (Struct metadata) serialize the same way every time and
    the control plane's content hashes change only when the content does (xDS rule 3)."""
    packed = any_pb2.Any()
    packed.Pack(message, deterministic=True)
    return packed


def duration_ms(milliseconds: int) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromMilliseconds(milliseconds)
    return value


def duration_s(seconds: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds)


def struct(values: Mapping[str, AnyValue]) -> struct_pb2.Struct:
    """A `Struct` from plain Python values (str, number, bool, None, nested dicts/lists)."""
    result = struct_pb2.Struct()
    result.update(dict(values))
    return result
