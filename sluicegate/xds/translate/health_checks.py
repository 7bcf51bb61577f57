"""Active health checks: per provider in YAML, one HealthCheck per route cluster in Envoy.

Envoy runs a cluster's health checks against every host, so the route carries the check
its health-checked providers share (validation makes them agree) and every other
provider's endpoint opts out (`health_check_config.disable_active_health_check`).

Health checks do not pass through the cluster's upstream HTTP filters: they carry no
provider key and no sluicegate headers. So the default path is the provider's
`<base_url path>/models` and any status below 500 counts as healthy (a provider answering
401 to a key-less request is up). The Host header is the provider's, set per endpoint
(`health_check_config.hostname`; Envoy would send the cluster name). TLS providers are
checked over their TLS socket (the endpoint's transport socket match). A cluster without
traffic is still checked every `interval` (no_traffic_interval), so a provider that died
while idle is known before the next request.
"""

from __future__ import annotations

from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2 as ec
from envoy.type.v3 import http_pb2, range_pb2
from google.protobuf import wrappers_pb2

from sluicegate.model import Provider, Route

from ._proto import duration_ms


def health_checks(route: Route) -> list[health_check_pb2.HealthCheck]:
    check = route.health_check
    if check is None:
        return []
    codec = http_pb2.HTTP2 if route.protocol == "http2" else http_pb2.HTTP1
    return [
        health_check_pb2.HealthCheck(
            timeout=duration_ms(check.timeout_ms),
            interval=duration_ms(check.interval_ms),
            no_traffic_interval=duration_ms(check.interval_ms),
            unhealthy_threshold=wrappers_pb2.UInt32Value(value=check.unhealthy_threshold),
            healthy_threshold=wrappers_pb2.UInt32Value(value=check.healthy_threshold),
            http_health_check=health_check_pb2.HealthCheck.HttpHealthCheck(
                path=check.path,
                codec_client_type=codec,
                # Envoy ranges are half-open: [start, end).
                expected_statuses=[
                    range_pb2.Int64Range(start=low, end=high + 1) for low, high in check.statuses
                ],
            ),
        )
    ]


def endpoint_health_check_config(
    route: Route, provider: Provider
) -> ec.Endpoint.HealthCheckConfig | None:
    """None when the route has no health checks (nothing to say per endpoint)."""
    if route.health_check is None:
        return None
    return ec.Endpoint.HealthCheckConfig(
        hostname=provider.authority,
        disable_active_health_check=provider.health_check is None,
    )
