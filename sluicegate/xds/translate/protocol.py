"""Upstream HTTP protocol and connection reuse (HttpProtocolOptions of the route cluster).

HTTP/1.1 keeps connections alive and sends one request at a time on each; HTTP/2 carries
up to `max_concurrent_streams` requests per connection and, with keepalive_interval set,
PINGs it so a dead connection is dropped before a request is sent on it. Envoy sets the
protocol per cluster, so a route's providers share one (validated).

`idle_timeout` closes idle pooled connections (Envoy's default is 1 h, far above most
providers' keep-alive: a connection the provider already closed would then fail a
request). `max_requests_per_connection` 0 is Envoy's "no limit".
"""

from __future__ import annotations

from envoy.config.core.v3 import protocol_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import wrappers_pb2

from sluicegate.model import Route

from ._proto import duration_ms

ExplicitHttpConfig = http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig


def explicit_http_config(
    route: Route,
) -> http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig:
    if route.protocol == "http1":
        return ExplicitHttpConfig(http_protocol_options=protocol_pb2.Http1ProtocolOptions())
    http2 = route.settings.pool.http2
    options = protocol_pb2.Http2ProtocolOptions(
        max_concurrent_streams=wrappers_pb2.UInt32Value(value=http2.max_concurrent_streams)
    )
    if http2.keepalive_interval:
        options.connection_keepalive.CopyFrom(
            protocol_pb2.KeepaliveSettings(
                interval=duration_ms(http2.keepalive_interval),
                timeout=duration_ms(http2.keepalive_timeout),
            )
        )
    return ExplicitHttpConfig(http2_protocol_options=options)


def common_http_protocol_options(route: Route) -> protocol_pb2.HttpProtocolOptions:
    pool = route.settings.pool
    options = protocol_pb2.HttpProtocolOptions(idle_timeout=duration_ms(pool.idle_timeout))
    if pool.max_requests_per_connection:
        options.max_requests_per_connection.CopyFrom(
            wrappers_pb2.UInt32Value(value=pool.max_requests_per_connection)
        )
    return options
