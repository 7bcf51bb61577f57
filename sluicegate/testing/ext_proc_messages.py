"""ext_proc ProcessingRequest messages as Envoy 1.40 sends them, to drive an ext_proc
server directly over gRPC (filter tests, ext_proc benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from sluicegate import wire

# What Envoy 1.40 sent for an endpoint in a real run (attribute xds.upstream_host_metadata).
HOST_METADATA_A = (
    'filter_metadata { key: "sluicegate" value { fields { key: "model_map" value { '
    'struct_value { fields { key: "m1" value { string_value: "a-m1" } } } } } fields { '
    'key: "path_prefix" value { string_value: "/pa/" } } fields { key: "provider" value { '
    'string_value: "a" } } } } '
)
ROUTE_METADATA_V1 = (
    'filter_metadata { key: "sluicegate" value { fields { key: "path_prefix" value { '
    'string_value: "/v1/" } } fields { key: "route" value { string_value: "r1" } } } } '
)


def headers_message(
    path: str = "/v1/chat/completions",
    *,
    end_of_stream: bool = False,
    extra: Sequence[tuple[str, str]] = (),
    content_length: int | None = None,
    attributes: Mapping[str, str] | None = None,
    original_path: str | None = None,
    method: str = "POST",
) -> Any:
    """A request_headers message: pseudo-headers, then `extra`, then content-length."""
    request = ep.ProcessingRequest()
    headers = request.request_headers.headers.headers
    pairs = [(":path", path), (":method", method), *extra]
    if content_length is not None:
        pairs.append(("content-length", str(content_length)))
    for key, value in pairs:
        headers.add(key=key, raw_value=value.encode())
    request.request_headers.end_of_stream = end_of_stream
    if attributes:
        fields = request.attributes["envoy.filters.http.ext_proc"].fields
        for key, value in attributes.items():
            fields[key].string_value = value
    if original_path is not None:
        namespace = request.metadata_context.filter_metadata[wire.METADATA_NAMESPACE]
        namespace.fields["original_path"].string_value = original_path
    return request


def body_message(body: bytes, *, end_of_stream: bool = True) -> Any:
    """A request_body message (the whole buffered body by default)."""
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=end_of_stream))
