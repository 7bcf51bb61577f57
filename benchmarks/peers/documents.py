"""The sluicegate documents the peers share: `envoy` runs the translation of the
routing-only one without ext_proc, `sluicegate-routing` serves it, `sluicegate-fast-routing`
serves it with `admission.lane: fast` (routed by Envoy alone), and `sluicegate-admission`
serves it with a tenant and a gate. One provider (the upstream), one route serving the
upstream's model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness.stack import addresses, unlimited_tenant
from sluicegate.config import hash_key

from .peer import Upstream

PROVIDER = "upstream"
ROUTE = "bench"
# Far above any load here: what is measured is the gate's cost, never a wait.
GATE = {"max_requests": 100_000, "max_tokens": 10**10}
# Envoy's gate counts requests only; the pool's limits bound it and are split between its
# partitions (model.EnvoyGate).
FAST_GATE = {"max_requests": 100_000}


def routing_doc(upstream: Upstream, listen_port: int) -> dict[str, Any]:
    """One listener on 127.0.0.1:`listen_port`, the upstream, one route; no tenants;
    routed by the routing stage (`lane: exact`: without it, Envoy would route it)."""
    return {
        "version": 1,
        "admission": {"lane": "exact"},
        "sluicegate": addresses(),
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen_port}],
        "providers": [{"name": PROVIDER, "base_url": upstream.api_base}],
        "routes": [
            {"name": ROUTE, "models": [upstream.model], "backends": [{"provider": PROVIDER}]}
        ],
    }


def fast_routing_doc(upstream: Upstream, listen_port: int) -> dict[str, Any]:
    """routing_doc routed by Envoy alone (docs/fast-lane.md)."""
    doc = routing_doc(upstream, listen_port)
    doc["admission"] = {"lane": "fast"}
    return doc


def fast_admission_doc(
    upstream: Upstream,
    listen_port: int,
    key: str,
    key_file: str,
    vip_key_file: str | None = None,
) -> dict[str, Any]:
    """fast_routing_doc with one tenant `bench` whose one key is `key` (its secret read
    from `key_file`, an absolute path) and limits that never refuse (10^9 requests and
    4x10^9 tokens a minute: Envoy's token buckets hold at most 2^32 - 1), all decided by
    Envoy (docs/fast-lane.md). With `vip_key_file` (a second key, never sent), also a
    tenant `vip` of the top class and the route's gate (FAST_GATE), which Envoy then
    enforces in two partitions ("Gates in the fast lane"); `bench` is `standard`, in the
    lower one."""
    doc = fast_routing_doc(upstream, listen_port)
    tenant = unlimited_tenant(key)
    tenant["rate_limits"] = {"requests": 10**9, "tokens": 4 * 10**9, "per": "1m"}
    tenant["keys"][0]["secret"] = {"file": key_file}
    doc["tenants"] = [tenant]
    if vip_key_file is not None:
        vip = Path(vip_key_file).read_text()
        doc["tenants"].append(
            {
                "name": "vip",
                "priority": "interactive",
                "keys": [
                    {"name": "vip-key", "hash": hash_key(vip), "secret": {"file": vip_key_file}}
                ],
            }
        )
        doc["routes"][0]["concurrency"] = dict(FAST_GATE)
    return doc


def auto_admission_doc(
    upstream: Upstream, listen_port: int, key: str, key_file: str
) -> dict[str, Any]:
    """fast_admission_doc (without the gate, which would hold every request of an `auto`
    tenant in the exact lane) with the tenant `auto` (docs/fast-lane.md, "The auto lane"):
    far from its limits it stays in the fast lane, while Envoy sends each of its requests'
    records to the control plane, which counts them."""
    doc = fast_admission_doc(upstream, listen_port, key, key_file)
    doc["admission"] = {"lane": "auto"}
    return doc


def admission_doc(upstream: Upstream, listen_port: int, key: str) -> dict[str, Any]:
    """routing_doc with the route's gate (GATE) and one tenant `bench` whose one key is
    `key`, with limits that never refuse (10^9 requests and 10^12 tokens a minute)."""
    doc = routing_doc(upstream, listen_port)
    doc["routes"][0]["concurrency"] = dict(GATE)
    doc["tenants"] = [unlimited_tenant(key)]
    return doc
