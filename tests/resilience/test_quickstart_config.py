"""The quickstart's Envoy shows the resilience settings in its config_dump (issue 3), and
its health checks pass against the quickstart's key-protected mock providers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluicegate.testing import quickstart_on_free_ports
from sluicegate.xds.translate.streams import STREAM_HEADER

from .harness import gateway, post, stats, wait_for

pytestmark = pytest.mark.e2e


def _streamed(route: dict[str, Any]) -> bool:
    """A model route's stream twin (xds/translate/streams.py) matches the stream header."""
    headers = route.get("match", {}).get("headers", [])
    return any(header["name"] == STREAM_HEADER for header in headers)


def _dump(stack: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(clusters by name, routes by name) from Envoy's /config_dump; a stream twin is
    named `<name> (stream)`."""
    dump = stack.admin_json("/config_dump")
    clusters: dict[str, Any] = {}
    routes: dict[str, Any] = {}
    for config in dump["configs"]:
        for item in config.get("dynamic_active_clusters", []):
            clusters[item["cluster"]["name"]] = item["cluster"]
        for item in config.get("dynamic_route_configs", []):
            for host in item["route_config"]["virtual_hosts"]:
                for route in host["routes"]:
                    name = route.get("name", "") + (" (stream)" if _streamed(route) else "")
                    routes.setdefault(name, route)
    return clusters, routes


def test_quickstart_config_dump_shows_the_resilience_settings(tmp_path: Path) -> None:
    doc = quickstart_on_free_ports(tmp_path)
    with gateway(tmp_path, doc) as stack:
        clusters, routes = _dump(stack)
        mini = clusters["route-mini"]
        assert mini["connect_timeout"] == "3s"
        (limits,) = mini["circuit_breakers"]["thresholds"]
        assert (limits["max_connections"], limits["max_pending_requests"]) == (4096, 1024)
        assert limits["retry_budget"] == {
            "budget_percent": {"value": 20.0}, "min_retry_concurrency": 3,
        }  # fmt: skip
        outlier = mini["outlier_detection"]
        assert outlier["enforcing_consecutive_gateway_failure"] == 100
        assert outlier["enforcing_failure_percentage"] == 0
        assert outlier["max_ejection_percent"] == 50
        assert outlier.get("split_external_local_origin_errors", False) is False
        (check,) = mini["health_checks"]
        assert check["http_health_check"]["path"] == "/v1/models"
        options = mini["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        ]
        assert options["common_http_protocol_options"]["idle_timeout"] == "50s"

        action = routes["mini"]["route"]
        assert action["timeout"] == "600s"  # not Envoy's 15 s default
        policy = action["retry_policy"]
        assert policy["num_retries"] == 1  # the route's override
        assert policy["per_try_timeout"] == "30s"  # the route's first_byte
        # Streamed requests wait first_token (the default) on the route's stream twin.
        stream_policy = routes["mini (stream)"]["route"]["retry_policy"]
        assert stream_policy["per_try_timeout"] == "15s"
        assert stream_policy["num_retries"] == 1
        assert policy["retry_host_predicate"][0]["name"] == (
            "envoy.retry_host_predicates.previous_hosts"
        )
        assert routes["qwen"]["route"]["retry_policy"]["num_retries"] == 2  # the default
        fallback = routes["deepseek"]["route"]["retry_policy"]["retry_priority"]
        assert fallback["name"] == "envoy.retry_priorities.previous_priorities"

        # The mocks want a key; the key-less health checks get 401 and count as healthy.
        wait_for(lambda: stats(stack, "route-mini").get("health_check.success", 0) >= 2,
                 what="health checks passing")  # fmt: skip
        assert stats(stack, "route-mini")["membership_healthy"] == 2
        answer = post(stack, "gpt-4o-mini", {"authorization": "Bearer sk-sluicegate-demo"})
        assert answer.status == 200, answer.body
