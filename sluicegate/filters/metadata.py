"""Per-provider and per-route facts read from Envoy metadata, parsed once per text.

An upstream ext_proc asks Envoy for the attributes `xds.upstream_host_metadata`
and `xds.route_metadata`; each arrives as the protobuf TEXT FORMAT of an
`envoy.config.core.v3.Metadata`. Endpoints and routes are few, so a parsed
result is cached by the exact text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from envoy.config.core.v3 import base_pb2
from google.protobuf import text_format

from sluicegate import wire

# Key in route metadata (namespace wire.METADATA_NAMESPACE) naming the route.
META_ROUTE: Final = "route"
# Key in dynamic metadata where the attempt stage keeps the client's path for retries.
META_ORIGINAL_PATH: Final = "original_path"
DEFAULT_ROUTE_PREFIX: Final = "/v1/"

_CACHE_LIMIT: Final = 4096


class MetadataError(ValueError):
    """Metadata that is not what the translator is supposed to write."""


def normalize_prefix(prefix: str) -> str:
    """'/v1/', '/v1' and 'v1' all become '/v1'; '/' and '' become ''."""
    prefix = prefix.rstrip("/")
    return prefix if not prefix or prefix.startswith("/") else "/" + prefix


@dataclass(frozen=True, slots=True)
class EndpointFacts:
    """What the chosen provider endpoint needs done to a request."""

    provider: str | None = None
    # client model -> provider model
    model_map: Mapping[str, str] = field(default_factory=dict)
    # client model -> provider model already JSON-encoded (spliced into bodies)
    model_json: Mapping[str, str] = field(default_factory=dict)
    # provider path prefix, normalized (no trailing '/'); None = leave the path alone
    path_prefix: str | None = None


@dataclass(frozen=True, slots=True)
class RouteFacts:
    """What the matched route contributes: its client-side path prefix."""

    route: str | None = None
    path_prefix: str = normalize_prefix(DEFAULT_ROUTE_PREFIX)


NO_ENDPOINT_FACTS: Final = EndpointFacts()
NO_ROUTE_FACTS: Final = RouteFacts()


def _namespace(text: str) -> Any:
    """The `sluicegate` Struct of a Metadata in text format, or None if absent."""
    metadata = base_pb2.Metadata()
    try:
        text_format.Parse(text, metadata)
    except text_format.ParseError as exc:
        raise MetadataError(f"metadata text does not parse: {exc}") from None
    if wire.METADATA_NAMESPACE not in metadata.filter_metadata:
        return None
    return metadata.filter_metadata[wire.METADATA_NAMESPACE]


def _string(struct: Any, key: str) -> str | None:
    if key not in struct.fields:
        return None
    value = struct.fields[key]
    if value.WhichOneof("kind") != "string_value":
        raise MetadataError(f"metadata key {key!r} must be a string")
    text: str = value.string_value
    return text


def parse_endpoint_facts(text: str) -> EndpointFacts:
    """EndpointFacts from the text of the upstream host's Metadata."""
    struct = _namespace(text)
    if struct is None:
        return NO_ENDPOINT_FACTS
    model_map: dict[str, str] = {}
    if wire.META_MODEL_MAP in struct.fields:
        value = struct.fields[wire.META_MODEL_MAP]
        if value.WhichOneof("kind") != "struct_value":
            raise MetadataError(f"metadata key {wire.META_MODEL_MAP!r} must be a map")
        for client_model, provider_model in value.struct_value.fields.items():
            if provider_model.WhichOneof("kind") != "string_value":
                raise MetadataError(f"model_map[{client_model!r}] must be a string")
            if provider_model.string_value != client_model:
                model_map[client_model] = provider_model.string_value
    prefix = _string(struct, wire.META_PATH_PREFIX)
    return EndpointFacts(
        provider=_string(struct, wire.META_PROVIDER),
        model_map=model_map,
        model_json={k: json.dumps(v, ensure_ascii=False) for k, v in model_map.items()},
        path_prefix=None if prefix is None else normalize_prefix(prefix),
    )


def parse_route_facts(text: str) -> RouteFacts:
    """RouteFacts from the text of the matched route's Metadata."""
    struct = _namespace(text)
    if struct is None:
        return NO_ROUTE_FACTS
    prefix = _string(struct, wire.META_PATH_PREFIX)
    return RouteFacts(
        route=_string(struct, META_ROUTE),
        path_prefix=normalize_prefix(DEFAULT_ROUTE_PREFIX if prefix is None else prefix),
    )


T = TypeVar("T")


class TextCache(Generic[T]):
    """Memoizes a parser by input text; bounded (cleared when full)."""

    __slots__ = ("_entries", "_parse")

    def __init__(self, parse: Callable[[str], T]) -> None:
        self._parse = parse
        self._entries: dict[str, T] = {}

    def get(self, text: str) -> T:
        entry = self._entries.get(text)
        if entry is None:
            entry = self._parse(text)
            if len(self._entries) >= _CACHE_LIMIT:
                self._entries.clear()
            self._entries[text] = entry
        return entry

    def __len__(self) -> int:
        return len(self._entries)


def upstream_path(original: str, route_prefix: str, provider_prefix: str | None) -> str:
    """The path to send to a provider.

    The client path is `<route prefix><rest>`; the provider gets
    `<provider prefix><rest>`. Both prefixes are normalized (no trailing '/'),
    so `rest` starts with '/' (or '?', or is empty). A path outside the route
    prefix, or a provider with no prefix, is left as is.
    """
    if provider_prefix is None:
        return original
    if route_prefix:
        if not original.startswith(route_prefix):
            return original
        rest = original[len(route_prefix) :]
        if rest and rest[0] not in "/?":
            return original
    else:
        rest = original
    result = provider_prefix + rest
    return result if result.startswith("/") else "/" + result
