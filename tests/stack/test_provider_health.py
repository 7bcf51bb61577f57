"""Each route's providers as Envoy's admin `/clusters?format=json` shows them, in `up`'s
/status (`providers`) and /metrics (`sluicegate_provider_healthy_hosts`,
`sluicegate_provider_ejected_hosts`); an Envoy that does not answer is said to, and
leaves the gauges without samples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.stack.http_site import serve_app
from sluicegate.stack.provider_health import (
    ProviderHealth,
    health_metrics,
    providers_document,
    read_clusters,
)
from sluicegate.stack.up_http import ChildEndpoint, make_up_app
from tests.ports import free_port


def host(zone: str | None, weight: int = 1, priority: int = 0, **flags: Any) -> dict[str, Any]:
    """A host as Envoy 1.40 prints it (false flags and priority 0 are left out)."""
    found: dict[str, Any] = {
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 1}},
        "health_status": {"eds_health_status": "HEALTHY", **flags},
        "weight": weight,
        "locality": {} if zone is None else {"zone": zone},
    }
    if priority:
        found["priority"] = priority
    return found


CLUSTERS: dict[str, Any] = {
    "cluster_statuses": [
        {"name": "sluicegate_ext_proc", "host_statuses": [host(None)]},
        {"name": "route-mini", "added_via_api": True, "host_statuses": [
            host("alpha", weight=3),
            host("beta", weight=1, failed_outlier_check=True),
        ]},
        {"name": "route-deepseek", "host_statuses": [
            host("beta", failed_active_health_check=True, pending_active_hc=True),
            host("alpha", priority=1),
        ]},
        # A provider behind a DNS name with two addresses: two hosts, one provider.
        {"name": "route-dns", "host_statuses": [
            host("gamma", weight=2),
            host("gamma", weight=2, eds_health_status="DRAINING"),
        ]},
    ]
}  # fmt: skip


def test_route_clusters_are_read_per_provider() -> None:
    routes = read_clusters(CLUSTERS)
    assert set(routes) == {"mini", "deepseek", "dns"}  # the ext_proc cluster is no route
    assert routes["mini"] == {
        "alpha": ProviderHealth(hosts=1, healthy=1, weight=3, share=0.75),
        "beta": ProviderHealth(hosts=1, healthy=0, ejected=1, weight=1, share=0.25),
    }
    beta, alpha = routes["deepseek"]["beta"], routes["deepseek"]["alpha"]
    assert (beta.healthy, beta.failed_health_check, beta.ejected) == (0, 1, 0)
    # Shares are of the priority level: the fallback is all of its own level.
    assert (alpha.priority, alpha.share, beta.share) == (1, 1.0, 1.0)
    assert routes["dns"]["gamma"] == ProviderHealth(hosts=2, healthy=1, weight=2, share=1.0)


@pytest.mark.parametrize(
    "document",
    [
        "not json's object",
        {"cluster_statuses": "x"},
        {"cluster_statuses": [7, {"name": 3}, {"name": "route-x", "host_statuses": [1, {}]}]},
        {"cluster_statuses": [{"name": "route-x", "host_statuses": [{"locality": "y"}]}]},
    ],
)
def test_anything_malformed_is_skipped(document: Any) -> None:
    assert read_clusters(document) in ({}, {"x": {}})


def test_the_document_is_sorted_plain_data() -> None:
    document = providers_document(read_clusters(CLUSTERS))
    assert list(document) == ["deepseek", "dns", "mini"]
    assert list(document["mini"]) == ["alpha", "beta"]
    assert document["mini"]["beta"] == {
        "hosts": 1, "healthy": 0, "ejected": 1, "failed_health_check": 0,
        "weight": 1, "priority": 0, "share": 0.25,
    }  # fmt: skip


def samples(text: bytes) -> dict[tuple[str, str, str], float]:
    return {
        (sample.name, sample.labels["route"], sample.labels["provider"]): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def test_gauges_per_route_and_provider() -> None:
    found = samples(health_metrics(read_clusters(CLUSTERS)))
    assert found[("sluicegate_provider_healthy_hosts", "mini", "beta")] == 0
    assert found[("sluicegate_provider_ejected_hosts", "mini", "beta")] == 1
    assert found[("sluicegate_provider_healthy_hosts", "mini", "alpha")] == 1
    assert found[("sluicegate_provider_healthy_hosts", "dns", "gamma")] == 1


def test_without_a_reading_the_gauges_are_declared_without_samples() -> None:
    text = health_metrics(None)
    assert b"# TYPE sluicegate_provider_healthy_hosts gauge" in text
    assert b"# TYPE sluicegate_provider_ejected_hosts gauge" in text
    assert samples(text) == {}


# -- up's endpoint, with an Envoy admin that answers or hangs ---------------------------------


async def fake_admin() -> tuple[str, web.AppRunner]:
    """Envoy's admin on TCP, as the quickstart has it, answering /clusters only."""

    async def clusters(request: web.Request) -> web.Response:
        assert request.query.get("format") == "json"
        return web.json_response(CLUSTERS)

    app = web.Application()
    app.router.add_get("/clusters", clusters)
    address = f"127.0.0.1:{free_port()}"
    return address, await serve_app(app, address)


async def ask_up(envoy_admin: str | None, tmp_path: Path) -> tuple[dict[str, Any], bytes]:
    """/status and /metrics of `up`'s endpoint whose two children are gone (no socket)."""
    gone = ChildEndpoint(f"unix:{tmp_path / 'gone.sock'}")
    admin = None if envoy_admin is None else ChildEndpoint(envoy_admin)
    address = f"127.0.0.1:{free_port()}"
    app = make_up_app(gone, gone, list, admin)
    runner = await serve_app(app, address)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{address}/status") as response:
                assert response.status == 200
                document: dict[str, Any] = await response.json()
            async with session.get(f"http://{address}/metrics") as response:
                assert response.status == 200
                metrics = await response.read()
        return document, metrics
    finally:
        await runner.cleanup()


async def test_up_shows_each_routes_providers_from_envoys_admin(tmp_path: Path) -> None:
    admin, runner = await fake_admin()
    try:
        document, metrics = await ask_up(admin, tmp_path)
    finally:
        await runner.cleanup()
    assert "envoy" not in document
    assert document["providers"] == providers_document(read_clusters(CLUSTERS))
    assert samples(metrics)[("sluicegate_provider_ejected_hosts", "mini", "beta")] == 1


async def test_an_envoy_that_does_not_answer_is_named_and_has_no_samples(
    hung_socket: str, tmp_path: Path
) -> None:
    document, metrics = await ask_up(hung_socket, tmp_path)
    assert document["envoy"] == "not answering"
    assert document["providers"] is None
    assert b"# TYPE sluicegate_provider_healthy_hosts gauge" in metrics
    assert b"sluicegate_provider_healthy_hosts{" not in metrics


async def test_without_an_envoy_of_its_own_nothing_is_said_of_one(tmp_path: Path) -> None:
    document, metrics = await ask_up(None, tmp_path)
    assert "envoy" not in document and document["providers"] is None
    assert document["control_plane"] == document["ext_proc"] == "not answering"
    assert b"sluicegate_provider_healthy_hosts{" not in metrics
