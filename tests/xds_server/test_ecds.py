"""ECDS (filter configs as their own xDS resource): push order (rule 12), what names
them (rule 14), and that changing one filter config pushes only that (rule 7)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from envoy.config.core.v3 import config_source_pb2, extension_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.http.credential_injector.v3 import credential_injector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.http.injected_credentials.generic.v3 import generic_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from sluicegate.stack.status_text import render_status
from sluicegate.xds.resource import (
    CLUSTER,
    ENDPOINT,
    EXTENSION_CONFIG,
    HTTP_PROTOCOL_OPTIONS,
    LISTENER,
    ROUTE,
    SECRET,
    references,
)
from sluicegate.xds.server import Snapshot, SnapshotCache, missing_references
from sluicegate.xds.server.stream import Phase, push_plan

from .helpers import (
    LUA,
    Ads,
    ads_source,
    cla,
    cluster,
    ecds_listener,
    listener,
    lua_config,
    names_of,
    route,
)

UPSERT, FULL, REMOVE = Phase.UPSERT, Phase.FULL, Phase.REMOVE


def discovered(name: str, source: Any = None) -> Any:
    """An HttpFilter whose config comes from ECDS."""
    http_filter = hcm_pb2.HttpFilter(name=name)
    http_filter.config_discovery.config_source.CopyFrom(source or ads_source())
    http_filter.config_discovery.type_urls.append(LUA)
    return http_filter


def upstream_filter_cluster(name: str, filter_name: str) -> Any:
    """An EDS cluster whose upstream HTTP filter (in an Any in a map) uses ECDS."""
    options = http_protocol_options_pb2.HttpProtocolOptions()
    options.explicit_http_config.http_protocol_options.SetInParent()
    options.http_filters.append(discovered(filter_name))
    c = cluster(name)
    c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].Pack(options)
    return c


def injector_config(name: str, secret_name: str) -> Any:
    """An ECDS resource whose filter reads a key over SDS."""
    credential = secret_pb2.SdsSecretConfig(name=secret_name, sds_config=ads_source())
    injector = credential_injector_pb2.CredentialInjector(
        credential=extension_pb2.TypedExtensionConfig(name="generic")
    )
    injector.credential.typed_config.Pack(generic_pb2.Generic(credential=credential))
    config = extension_pb2.TypedExtensionConfig(name=name)
    config.typed_config.Pack(injector)
    return config


def ecds_snapshot(filters: dict[str, str], port: int = 10000) -> Snapshot:
    """One listener (routes "r") whose filters, name → header value, come from ECDS."""
    return Snapshot.from_resources({
        EXTENSION_CONFIG: [lua_config(n, v) for n, v in filters.items()],
        LISTENER: [ecds_listener("l", "r", filters, port)],
        ROUTE: [route("r")],
    })  # fmt: skip


# ----- push order (rule 12) ---------------------------------------------------------------


def test_push_plan_sends_filter_configs_after_secrets_before_clusters_and_listeners() -> None:
    every = [ROUTE, LISTENER, ENDPOINT, CLUSTER, EXTENSION_CONFIG, SECRET]
    assert push_plan(every) == [
        [(SECRET, UPSERT)],
        [(EXTENSION_CONFIG, UPSERT)],
        [(CLUSTER, UPSERT), (ENDPOINT, UPSERT)],
        [(LISTENER, FULL)],
        [(ROUTE, UPSERT)],
        [(ROUTE, REMOVE), (CLUSTER, REMOVE), (ENDPOINT, REMOVE), (EXTENSION_CONFIG, REMOVE),
         (SECRET, REMOVE)],
    ]  # fmt: skip
    assert push_plan([LISTENER, EXTENSION_CONFIG]) == [
        [(EXTENSION_CONFIG, UPSERT)],
        [(LISTENER, FULL)],
        [(EXTENSION_CONFIG, REMOVE)],
    ]


# ----- what names a filter config (rule 14) -----------------------------------------------


def test_listener_names_the_filter_configs_it_discovers_over_ads() -> None:
    lis = ecds_listener("l", "r", ["auth", "limits"])
    assert references(LISTENER, lis) == {ROUTE: {"r"}, EXTENSION_CONFIG: {"auth", "limits"}}


def test_filters_with_inline_config_or_another_source_name_nothing() -> None:
    elsewhere = config_source_pb2.ConfigSource(path_config_source={"path": "/etc/auth.yaml"})
    lis = ecds_listener("l", "r", ["auth"], source=elsewhere)
    assert references(LISTENER, lis) == {ROUTE: {"r"}}  # the router's config is inline
    assert references(LISTENER, listener("l", "r")) == {ROUTE: {"r"}}


def test_listener_and_network_filters_and_upstream_filters_name_their_configs() -> None:
    lis = listener("l", "r")
    tls = listener_components_pb2.ListenerFilter(name="tls-inspector")
    tls.config_discovery.config_source.CopyFrom(ads_source())
    lis.listener_filters.append(tls)
    network = listener_components_pb2.Filter(name="network-limit")
    network.config_discovery.config_source.CopyFrom(ads_source())
    lis.filter_chains[0].filters.insert(0, network)
    assert references(LISTENER, lis) == {
        ROUTE: {"r"},
        EXTENSION_CONFIG: {"tls-inspector", "network-limit"},
    }
    assert references(CLUSTER, upstream_filter_cluster("c", "upstream-auth")) == {
        ENDPOINT: {"c"},
        EXTENSION_CONFIG: {"upstream-auth"},
    }


def test_filter_config_names_its_sds_secrets() -> None:
    assert references(EXTENSION_CONFIG, injector_config("keys", "key")) == {SECRET: {"key"}}
    assert references(EXTENSION_CONFIG, lua_config("f", "v1")) == {}


def test_snapshot_without_a_discovered_filter_config_is_refused() -> None:
    broken = Snapshot.from_resources({
        CLUSTER: [upstream_filter_cluster("c", "up")],
        ENDPOINT: [cla("c")],
        EXTENSION_CONFIG: [lua_config("auth", "v1"), injector_config("keys", "key")],
        LISTENER: [ecds_listener("l", "r", ["auth", "limits"])],
        ROUTE: [route("r")],
    })  # fmt: skip
    assert [str(m) for m in missing_references(broken)] == [
        "Listener 'l' needs TypedExtensionConfig 'limits'",
        "Cluster 'c' needs TypedExtensionConfig 'up'",
        "TypedExtensionConfig 'keys' needs Secret 'key'",
    ]
    cache = SnapshotCache()
    with pytest.raises(ValueError, match="Listener 'l' needs TypedExtensionConfig 'limits'"):
        cache.set_snapshot(broken)
    cache.set_snapshot(ecds_snapshot({"auth": "v1", "limits": "v1"}))


# ----- over real gRPC ADS -----------------------------------------------------------------


async def test_sotw_filter_config_goes_before_the_listener_and_alone_when_only_it_changed(
    ads: Ads,
) -> None:
    ads.cache.set_snapshot(ecds_snapshot({"f": "v1"}))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=LISTENER)
    await raw.ack(await raw.recv())
    # Like Envoy: the listener's filter subscribes to its config by name.
    await raw.send(type_url=EXTENSION_CONFIG, resource_names=["f"])
    ecds = await raw.recv()
    assert names_of(ecds) == ["f"]
    await raw.ack(ecds, ["f"])
    await raw.send(type_url=ROUTE, resource_names=["r"])
    await raw.ack(await raw.recv(), ["r"])

    # Listener and filter config both change: the config goes first, the listener
    # only once it is ACKed.
    both = ecds_snapshot({"f": "v2"}, port=10001)
    ads.cache.set_snapshot(both)
    ecds = await raw.recv()
    assert ecds.type_url == EXTENSION_CONFIG and names_of(ecds) == ["f"]
    assert ecds.version_info == both.version(EXTENSION_CONFIG)
    await raw.quiet(0.1)  # LDS waits for the answer
    await raw.ack(ecds, ["f"])
    lds = await raw.recv()
    assert lds.type_url == LISTENER
    await raw.ack(lds)
    await raw.quiet()  # routes did not change

    # Only the filter config changes: only it is sent (the listener is not rebuilt).
    ads.cache.set_snapshot(ecds_snapshot({"f": "v3"}, port=10001))
    ecds = await raw.recv()
    assert ecds.type_url == EXTENSION_CONFIG and names_of(ecds) == ["f"]
    await raw.ack(ecds, ["f"])
    await raw.quiet()


async def test_delta_filter_config_removed_after_the_listener_stops_naming_it(ads: Ads) -> None:
    ads.cache.set_snapshot(ecds_snapshot({"f": "v1", "g": "v1"}))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=LISTENER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=EXTENSION_CONFIG, resource_names_subscribe=["f", "g"])
    first = await raw.recv()
    assert sorted(names_of(first)) == ["f", "g"]
    await raw.ack(first)

    # g goes, f changes: f's new config first, then the listener without g, then g removed.
    ads.cache.set_snapshot(ecds_snapshot({"f": "v2"}))
    seen = []
    for _ in range(3):
        response = await raw.recv()
        seen.append((response.type_url, names_of(response), list(response.removed_resources)))
        await raw.quiet(0.1)  # each step waits for the answer to the last
        await raw.ack(response)
    assert seen == [
        (EXTENSION_CONFIG, ["f"], []),
        (LISTENER, ["l"], []),
        (EXTENSION_CONFIG, [], ["g"]),
    ]
    await raw.quiet()


async def test_a_node_is_not_behind_on_configs_it_never_asked_for(ads: Ads) -> None:
    """`sluicegate status` compares what a node ACKed with the version of its own view:
    a snapshot's other filter configs (another Envoy's, such as Envoy's own filters beside
    the native library's) do not make it look behind ("(serving …)" for ever, seen on
    the quickstart), while a change it has not ACKed yet does."""
    ads.cache.set_snapshot(ecds_snapshot({"f": "v1", "g": "v1"}))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=LISTENER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=EXTENSION_CONFIG, resource_names=["f"])  # f alone
    await raw.ack(await raw.recv(), ["f"])

    def ecds_row() -> str:
        (node,) = ads.cache.status()
        snapshot = ads.cache.get_snapshot("n")
        assert snapshot is not None
        document = {"nodes": [node.to_dict()], "versions": snapshot.versions()}
        text = render_status(document, time.time())
        (row,) = [line.split() for line in text.splitlines() if "TypedExtensionConfig" in line]
        return " ".join(row[1:-1])  # ACKED, without LAST NACK's "-"

    await raw.quiet(0.1)
    acked = ads.cache.status()[0].acked_versions()[EXTENSION_CONFIG]
    assert ecds_row() == acked
    ads.cache.set_snapshot(ecds_snapshot({"f": "v1", "g": "v2"}))  # not the node's
    await raw.quiet()
    assert ecds_row() == acked
    ads.cache.set_snapshot(ecds_snapshot({"f": "v2", "g": "v2"}))  # the node's
    pushed = await raw.recv()
    assert ecds_row() == f"{acked} (serving {pushed.version_info})"
    await raw.ack(pushed, ["f"])
    await raw.quiet(0.1)
    assert ecds_row() == pushed.version_info
