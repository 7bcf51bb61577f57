"""Helpers for tests and benchmarks only: never imported by the gateway itself.

Shipped with the package so that the test suite and `benchmarks/` share one copy:
free ports (`ports`), a real redis-server process (`redis_server`), static Envoy
bootstraps, from translated resources (`bootstraps`) or hand-written with both ext_proc
stages (`static_gateway`), ext_proc request messages as Envoy sends them
(`ext_proc_messages`), an ADS client that behaves like Envoy (`ads_client`), and a
process's CPU, memory and children read from /proc (`procfs`), a request's metadata as
the request record's fields (`record_fields`), the quickstart on free
ports (`quickstart`) and closed-loop load that sorts every request's outcome around a
fault (`steady_load`).
"""

from __future__ import annotations

from .ads_client import GRPC_EOF, AdsClient, NackPolicy, Received
from .bootstraps import (
    admin,
    ads_bootstrap,
    edited_listeners,
    grpc_cluster,
    static_bootstrap,
    to_dict,
    without_sds_config,
)
from .ext_proc_messages import HOST_METADATA_A, ROUTE_METADATA_V1, body_message, headers_message
from .ports import free_port, free_ports
from .procfs import (
    alive,
    children_of,
    cpu_by_role,
    cpu_seconds,
    exact_cpu_seconds,
    rss_bytes,
    running_children,
    sys_seconds,
)
from .quickstart import EXAMPLES, quickstart_on_free_ports
from .record_fields import envoy_text, metadata_fields, usage_fields
from .redis_server import RedisServer
from .static_gateway import Provider, Route, ext_proc_filter, static_gateway
from .steady_load import SETTLED_S, Verdict, judge, steady_load, wait_until

__all__ = [
    "EXAMPLES",
    "GRPC_EOF",
    "HOST_METADATA_A",
    "ROUTE_METADATA_V1",
    "SETTLED_S",
    "AdsClient",
    "NackPolicy",
    "Provider",
    "Received",
    "RedisServer",
    "Route",
    "Verdict",
    "admin",
    "ads_bootstrap",
    "alive",
    "body_message",
    "children_of",
    "cpu_by_role",
    "cpu_seconds",
    "edited_listeners",
    "envoy_text",
    "exact_cpu_seconds",
    "ext_proc_filter",
    "free_port",
    "free_ports",
    "grpc_cluster",
    "headers_message",
    "judge",
    "metadata_fields",
    "quickstart_on_free_ports",
    "rss_bytes",
    "running_children",
    "static_bootstrap",
    "static_gateway",
    "steady_load",
    "sys_seconds",
    "to_dict",
    "usage_fields",
    "wait_until",
    "without_sds_config",
]
