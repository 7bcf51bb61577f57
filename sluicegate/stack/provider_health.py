"""Each route's providers as the local Envoy holds them: hosts, health, ejection, weight.

`up` reads its Envoy's admin `/clusters?format=json` (stack/up_http.py) and shows the
result under `providers` in `/status` and as two gauges on `/metrics`. A route is one
Envoy cluster, `route-<name>`, whose hosts are its providers, each in a locality of its
own whose zone is the provider's name (xds/translate/endpoints.py); so a host's
`locality.zone` names its provider, and a provider behind a DNS name that resolves to
several addresses is several hosts.

Envoy's `/clusters` gives each host's weight, not its locality's. The translator gives a
provider's endpoint the weight of its locality (endpoints.py), so the host's weight is
the locality weight Envoy holds: the configured one, or the one latency routing pushed.

Health follows Envoy's own reading of a host's flags: a host is unhealthy while it is
ejected by outlier detection, fails its active health check (a host Envoy has not checked
yet counts as failing, as Envoy treats it), or EDS says it is unhealthy or draining.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.model import CLUSTER_PREFIX

# Envoy's admin query for the hosts of every cluster, as JSON.
CLUSTERS_PATH: Final = "/clusters?format=json"
# EDS health states under which Envoy sends a host nothing (TIMEOUT: EDS's own health
# check timed out; Envoy counts it as failed EDS health).
_EDS_UNHEALTHY: Final = frozenset({"UNHEALTHY", "DRAINING", "TIMEOUT"})
# Flags of HostHealthStatus that make Envoy send a host nothing.
_FAILED_FLAGS: Final = (
    "failed_active_health_check",
    "failed_outlier_check",
    "excluded_via_immediate_hc_fail",
    "active_hc_timeout",
)


@dataclass
class ProviderHealth:
    """One provider in one route's cluster: its hosts, and how many of them Envoy uses."""

    hosts: int = 0
    healthy: int = 0
    ejected: int = 0  # outlier detection took them out
    failed_health_check: int = 0  # the active health check fails (or has not passed yet)
    weight: int | None = None  # the locality weight Envoy holds
    priority: int = 0  # 0 first; higher numbers are fallbacks
    # Its weight's share of its priority level's: unlike the weight, whose unit is the
    # configured weights' on a static route and WEIGHT_SCALE's on a latency route, it
    # compares across routes.
    share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: route name -> provider name -> its health in the route's cluster.
RouteHealth = dict[str, dict[str, ProviderHealth]]


def read_clusters(document: Any) -> RouteHealth:
    """The route clusters of Envoy's `/clusters?format=json`, by route and provider.
    Other clusters (xDS, ext_proc) and hosts without a provider's zone are left out;
    anything malformed is skipped rather than raised: this is a view, never a check."""
    routes: RouteHealth = {}
    statuses = document.get("cluster_statuses") if isinstance(document, Mapping) else None
    for cluster in statuses if isinstance(statuses, list) else ():
        name = cluster.get("name") if isinstance(cluster, Mapping) else None
        if not isinstance(name, str) or not name.startswith(CLUSTER_PREFIX):
            continue
        providers = routes.setdefault(name.removeprefix(CLUSTER_PREFIX), {})
        hosts = cluster.get("host_statuses")
        for host in hosts if isinstance(hosts, list) else ():
            if isinstance(host, Mapping):
                _count_host(providers, host)
        _set_shares(providers)
    return routes


def _count_host(providers: dict[str, ProviderHealth], host: Mapping[str, Any]) -> None:
    locality = host.get("locality")
    provider = locality.get("zone") if isinstance(locality, Mapping) else None
    if not isinstance(provider, str) or not provider:
        return
    health = providers.setdefault(provider, ProviderHealth())
    flags = host.get("health_status")
    flags = flags if isinstance(flags, Mapping) else {}
    health.hosts += 1
    health.ejected += bool(flags.get("failed_outlier_check"))
    health.failed_health_check += bool(flags.get("failed_active_health_check"))
    failed = any(flags.get(flag) for flag in _FAILED_FLAGS)
    health.healthy += not failed and flags.get("eds_health_status") not in _EDS_UNHEALTHY
    weight, priority = host.get("weight"), host.get("priority", 0)
    if isinstance(weight, int):
        health.weight = weight
    if isinstance(priority, int):
        health.priority = priority


def _set_shares(providers: Mapping[str, ProviderHealth]) -> None:
    totals: dict[int, int] = {}
    for health in providers.values():
        totals[health.priority] = totals.get(health.priority, 0) + (health.weight or 0)
    for health in providers.values():
        total = totals[health.priority]
        if health.weight is not None and total > 0:
            health.share = round(health.weight / total, 4)


def providers_document(routes: RouteHealth) -> dict[str, dict[str, dict[str, Any]]]:
    """`/status` `providers`: route -> provider -> hosts, healthy, ejected,
    failed_health_check, weight, priority, share; sorted by name."""
    return {
        route: {name: providers[name].to_dict() for name in sorted(providers)}
        for route, providers in sorted(routes.items())
    }


# Gauge name, help, and the ProviderHealth field it shows. The names are fixed: the
# alert rules and the dashboard in deploy/ use them.
_GAUGES: Final = (
    (
        "sluicegate_provider_healthy_hosts",
        "Hosts of a route's provider that Envoy sends requests to",
        "healthy",
    ),
    (
        "sluicegate_provider_ejected_hosts",
        "Hosts of a route's provider that Envoy's outlier detection ejected",
        "ejected",
    ),
)


def health_gauges(routes: RouteHealth | None) -> Iterator[GaugeMetricFamily]:
    """The gauges, declared always; with samples only when Envoy answered (`routes`)."""
    for name, help_text, field in _GAUGES:
        gauge = GaugeMetricFamily(name, help_text, labels=["route", "provider"])
        for route, providers in sorted((routes or {}).items()):
            for provider, health in sorted(providers.items()):
                gauge.add_metric([route, provider], getattr(health, field))
        yield gauge


class _Reading(Collector):
    """One reading of Envoy's admin, exposed once."""

    def __init__(self, routes: RouteHealth | None) -> None:
        self.routes = routes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return health_gauges(self.routes)


def health_metrics(routes: RouteHealth | None) -> bytes:
    """Prometheus text of the gauges for one reading (None: Envoy did not answer)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Reading(routes))
    return bytes(generate_latest(registry))
