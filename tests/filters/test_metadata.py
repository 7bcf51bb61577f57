"""Reading provider and route facts from Envoy's metadata text, and the path rule."""

from __future__ import annotations

import pytest

from sluicegate.filters import (
    EndpointFacts,
    RouteFacts,
    parse_endpoint_facts,
    parse_route_facts,
    upstream_path,
)
from sluicegate.filters.metadata import MetadataError, TextCache

from .helpers import HOST_METADATA_A, ROUTE_METADATA_V1


def test_endpoint_text_as_envoy_sends_it():
    facts = parse_endpoint_facts(HOST_METADATA_A)
    assert facts.provider == "a"
    assert facts.model_map == {"m1": "a-m1"}
    assert facts.model_json == {"m1": '"a-m1"'}
    assert facts.path_prefix == "/pa"


def test_route_text_as_envoy_sends_it():
    assert parse_route_facts(ROUTE_METADATA_V1) == RouteFacts(route="r1", path_prefix="/v1")


@pytest.mark.parametrize("text", ["", 'filter_metadata { key: "other" value { } }'])
def test_no_sluicegate_namespace_means_no_facts(text: str):
    assert parse_endpoint_facts(text) == EndpointFacts()
    assert parse_route_facts(text) == RouteFacts(route=None, path_prefix="/v1")


def test_identity_mappings_are_dropped_and_unicode_kept():
    text = (
        'filter_metadata { key: "sluicegate" value { fields { key: "model_map" value { '
        'struct_value { fields { key: "same" value { string_value: "same" } } '
        'fields { key: "m" value { string_value: "модель \\"q\\"" } } } } } } }'
    )
    facts = parse_endpoint_facts(text)
    assert facts.model_map == {"m": 'модель "q"'}
    assert facts.model_json == {"m": '"модель \\"q\\""'}
    assert facts.path_prefix is None


@pytest.mark.parametrize(
    "text",
    [
        "filter_metadata { key: ",
        "not metadata at all",
        'filter_metadata { key: "sluicegate" value { fields { key: "path_prefix" value '
        "{ number_value: 1 } } } }",
        'filter_metadata { key: "sluicegate" value { fields { key: "model_map" value '
        '{ string_value: "x" } } } }',
        'filter_metadata { key: "sluicegate" value { fields { key: "model_map" value '
        '{ struct_value { fields { key: "m" value { bool_value: true } } } } } } }',
    ],
)
def test_bad_metadata_is_an_error(text: str):
    with pytest.raises(MetadataError):
        parse_endpoint_facts(text)


def test_text_cache_parses_once_and_stays_bounded():
    calls: list[str] = []

    def parse(text: str) -> int:
        calls.append(text)
        return len(text)

    cache = TextCache(parse)
    assert cache.get("abc") == 3 and cache.get("abc") == 3
    assert calls == ["abc"]
    for index in range(5000):
        cache.get(str(index))
    assert len(cache) <= 4096


@pytest.mark.parametrize(
    ("original", "route", "provider", "expected"),
    [
        ("/v1/chat/completions", "/v1", "/openai/v1", "/openai/v1/chat/completions"),
        ("/v1/chat/completions?a=1&b=2", "/v1", "/p", "/p/chat/completions?a=1&b=2"),
        ("/v1/chat/completions", "/v1", "", "/chat/completions"),
        ("/v1/chat/completions", "/v1", "/v1", "/v1/chat/completions"),
        ("/v1/chat/completions", "/v1", None, "/v1/chat/completions"),
        ("/team/v1/embeddings", "/team/v1", "/api/paas/v4", "/api/paas/v4/embeddings"),
        ("/v1", "/v1", "/p", "/p"),
        ("/v1", "/v1", "", "/"),
        ("/v1?x=1", "/v1", "", "/?x=1"),
        ("/chat/completions", "", "/p/v1", "/p/v1/chat/completions"),
        ("/v10/chat", "/v1", "/p", "/v10/chat"),  # not under the route prefix: unchanged
        ("/other/x", "/v1", "/p", "/other/x"),
    ],
)
def test_upstream_path(original: str, route: str, provider: str | None, expected: str):
    assert upstream_path(original, route, provider) == expected


@pytest.mark.parametrize(
    ("prefix", "normalized"), [("/v1/", "/v1"), ("/v1", "/v1"), ("v1/", "/v1"), ("/", ""), ("", "")]
)
def test_prefixes_are_normalized(prefix: str, normalized: str):
    text = (
        'filter_metadata { key: "sluicegate" value { fields { key: "path_prefix" value '
        f'{{ string_value: "{prefix}" }} }} }} }}'
    )
    assert parse_endpoint_facts(text).path_prefix == normalized
    assert parse_route_facts(text).path_prefix == normalized
