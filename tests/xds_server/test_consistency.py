"""Rule 14: an inconsistent snapshot is never published; the last good one keeps serving."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from envoy.config.core.v3 import config_source_pb2, extension_pb2
from envoy.extensions.filters.http.credential_injector.v3 import credential_injector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.http.injected_credentials.generic.v3 import generic_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from sluicegate.xds.resource import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET
from sluicegate.xds.server import Snapshot, SnapshotCache

from .helpers import Ads, ads_source, cla, cluster, listener, names_of, route, snapshot


def secret(name: str) -> Any:
    return secret_pb2.Secret(name=name, generic_secret=secret_pb2.GenericSecret())


def sds(name: str, source: Any = None) -> Any:
    return secret_pb2.SdsSecretConfig(name=name, sds_config=source or ads_source())


def tls_cluster(name: str, cert: str, source: Any = None) -> Any:
    """An EDS cluster whose TLS transport socket reads its certificate over SDS."""
    c = cluster(name)
    context = tls_pb2.UpstreamTlsContext()
    context.common_tls_context.tls_certificate_sds_secret_configs.append(sds(cert, source))
    c.transport_socket.name = "envoy.transport_sockets.tls"
    c.transport_socket.typed_config.Pack(context)
    return c


def keyed_cluster(name: str, key: str) -> Any:
    """An EDS cluster whose upstream credential_injector reads a key over SDS, nested
    in Any within Any as the translator builds it (translate/secrets.py)."""
    generic = generic_pb2.Generic(credential=sds(key), header="authorization")
    injector = credential_injector_pb2.CredentialInjector(
        credential=extension_pb2.TypedExtensionConfig(name="generic")
    )
    injector.credential.typed_config.Pack(generic)
    options = http_protocol_options_pb2.HttpProtocolOptions()
    options.explicit_http_config.http_protocol_options.SetInParent()
    options.http_filters.add(name="credentials").typed_config.Pack(injector)
    c = cluster(name)
    c.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]\
        .Pack(options)  # fmt: skip
    return c


def inline_routes_listener(name: str) -> Any:
    """A listener whose HTTP connection manager carries its routes inline (no RDS)."""
    lis = listener(name, "unused")
    manager = hcm_pb2.HttpConnectionManager()
    lis.filter_chains[0].filters[-1].typed_config.Unpack(manager)
    manager.ClearField("rds")
    manager.route_config.CopyFrom(route("inline"))
    lis.filter_chains[0].filters[-1].typed_config.Pack(manager)
    return lis


def missing_of(resources: dict[str, list[Any]]) -> list[str]:
    from sluicegate.xds.server import missing_references

    return [str(m) for m in missing_references(Snapshot.from_resources(resources))]


# ----- what counts as missing -------------------------------------------------------------


def test_complete_snapshot_is_consistent() -> None:
    assert missing_of({
        CLUSTER: [cluster("a"), tls_cluster("t", "cert"), keyed_cluster("k", "key")],
        ENDPOINT: [cla("a"), cla("t"), cla("k")],
        LISTENER: [listener("l", "r"), inline_routes_listener("inline")],
        ROUTE: [route("r")],
        SECRET: [secret("cert"), secret("key")],
    }) == []  # fmt: skip


def test_unreferenced_resources_are_harmless() -> None:
    # Unlike go-control-plane's Consistent: only what is missing breaks Envoy.
    assert missing_of({ENDPOINT: [cla("a")], ROUTE: [route("r")], SECRET: [secret("s")]}) == []


def test_eds_cluster_without_its_assignment() -> None:
    named = cluster("b")
    named.eds_cluster_config.service_name = "b-service"
    assert missing_of({CLUSTER: [cluster("a"), named], ENDPOINT: [cla("b")]}) == [
        "Cluster 'a' needs ClusterLoadAssignment 'a'",
        "Cluster 'b' needs ClusterLoadAssignment 'b-service'",
    ]


def test_listener_without_its_route_configuration() -> None:
    assert missing_of({LISTENER: [listener("l", "r"), inline_routes_listener("i")]}) == [
        "Listener 'l' needs RouteConfiguration 'r'"
    ]


def test_cluster_without_its_sds_secrets() -> None:
    resources = {
        CLUSTER: [tls_cluster("t", "cert"), keyed_cluster("k", "key")],
        ENDPOINT: [cla("t"), cla("k")],
    }
    assert missing_of(resources) == [
        "Cluster 't' needs Secret 'cert'",
        "Cluster 'k' needs Secret 'key'",
    ]


def test_references_served_elsewhere_are_not_the_snapshots() -> None:
    from_file = config_source_pb2.ConfigSource(path_config_source={"path": "/etc/cert.yaml"})
    static = secret_pb2.SdsSecretConfig(name="static-cert")  # bootstrap static secret
    c = tls_cluster("t", "cert", from_file)
    context = tls_pb2.UpstreamTlsContext()
    c.transport_socket.typed_config.Unpack(context)
    context.common_tls_context.tls_certificate_sds_secret_configs.append(static)
    c.transport_socket.typed_config.Pack(context)
    eds_from_file = cluster("f")
    eds_from_file.eds_cluster_config.eds_config.CopyFrom(from_file)
    assert missing_of({CLUSTER: [c, eds_from_file], ENDPOINT: [cla("t")]}) == []


def test_remembered_references_do_not_hide_a_missing_resource() -> None:
    from sluicegate.xds.server.consistency import ConsistencyCheck

    check = ConsistencyCheck()
    assert check.missing(snapshot(["a", "b"])) == []
    # Same clusters (their references are remembered), but b's assignment is gone.
    again = Snapshot.from_resources({CLUSTER: [cluster("a"), cluster("b")], ENDPOINT: [cla("a")]})
    assert [str(m) for m in check.missing(again)] == ["Cluster 'b' needs ClusterLoadAssignment 'b'"]


def test_long_list_is_shortened_in_the_message() -> None:
    from sluicegate.xds.server import InconsistentSnapshot, missing_references

    broken = Snapshot.from_resources({CLUSTER: [cluster(f"c{i}") for i in range(8)]})
    error = InconsistentSnapshot(missing_references(broken))
    assert len(error.missing) == 8
    assert "Cluster 'c0' needs ClusterLoadAssignment 'c0'" in str(error)
    assert str(error).endswith("(and 3 more)")


# ----- the cache refuses it ---------------------------------------------------------------


def test_cache_refuses_inconsistent_snapshot_and_logs_what_is_missing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = SnapshotCache()
    good = snapshot(["a"])
    cache.set_snapshot(good)
    broken = snapshot(["a", "b"], endpoints={"a": 9000})
    needs = "Cluster 'b' needs ClusterLoadAssignment 'b'"
    with (
        caplog.at_level(logging.ERROR, "sluicegate.xds.server"),
        pytest.raises(ValueError, match=needs),
    ):
        cache.set_snapshot(broken)
    assert "Cluster 'b' needs ClusterLoadAssignment 'b'" in caplog.text
    assert "previous snapshot keeps serving" in caplog.text
    assert cache.get_snapshot() is good
    # A caller can ask first, before changing its own state; asking publishes nothing.
    assert [str(m) for m in cache.missing_references(broken)] == [needs]
    assert cache.missing_references(snapshot(["a", "b"])) == []
    assert cache.get_snapshot() is good
    # A node's override is checked too; the node keeps the default.
    with pytest.raises(ValueError, match="needs RouteConfiguration 'gone'"):
        cache.set_snapshot(snapshot(["a"], listeners={"l": "gone"}), node_id="n1")
    assert cache.get_snapshot("n1") is good


# ----- a connected client keeps the last good snapshot (real gRPC ADS) --------------------


async def test_sotw_client_keeps_last_good_snapshot(ads: Ads) -> None:
    good = snapshot(["a"])
    ads.cache.set_snapshot(good)
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ENDPOINT, resource_names=["a"])
    await raw.ack(await raw.recv(), ["a"])
    await raw.send(type_url=LISTENER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ROUTE, resource_names=["r"])
    await raw.ack(await raw.recv(), ["r"])
    # A new cluster without its endpoints, then a listener naming absent routes.
    for broken in (
        snapshot(["a", "b"], endpoints={"a": 9000}),
        snapshot(["a"], listeners={"l": "r", "l2": "missing"}),
    ):
        with pytest.raises(ValueError):
            ads.cache.set_snapshot(broken)
        await raw.quiet()
    # A client connecting now gets the last good snapshot.
    fresh = ads.sotw()
    await fresh.send(node=ads.node("m"), type_url=CLUSTER)
    cds = await fresh.recv()
    assert names_of(cds) == ["a"] and cds.version_info == good.version(CLUSTER)
    await fresh.send(type_url=LISTENER)
    assert names_of(await fresh.recv()) == ["l"]


async def test_delta_client_keeps_last_good_snapshot(ads: Ads) -> None:
    good = snapshot(["a"])
    ads.cache.set_snapshot(good)
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ENDPOINT, resource_names_subscribe=["a"])
    await raw.ack(await raw.recv())
    with pytest.raises(ValueError):
        ads.cache.set_snapshot(Snapshot.from_resources({CLUSTER: [cluster("a", timeout_s=5)]}))
    await raw.quiet()
    # The next consistent snapshot goes through as usual.
    fixed = Snapshot.from_resources({CLUSTER: [cluster("a", timeout_s=5)], ENDPOINT: [cla("a")]})
    ads.cache.set_snapshot(fixed)
    response = await raw.recv()
    assert response.type_url == CLUSTER and response.system_version_info == fixed.version(CLUSTER)
