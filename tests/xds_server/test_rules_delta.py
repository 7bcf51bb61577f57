"""The xDS rules of docs/xds-rules.md (1-13) on incremental (delta) ADS, over raw gRPC."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from sluicegate.xds.resource import CLUSTER, ENDPOINT, LISTENER, ROUTE
from sluicegate.xds.server import Snapshot

from .helpers import Ads, cla, cluster, listener, names_of, route, snapshot


async def test_rule_1_node_remembered_on_delta(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["shared"]))
    ads.cache.set_snapshot(snapshot(["special"], listeners={"special-l": "r"}), node_id="n1")
    raw = ads.delta()
    await raw.send(node=ads.node("n1"), type_url=CLUSTER)
    assert names_of(await raw.recv()) == ["special"]
    await raw.send(type_url=LISTENER)
    assert names_of(await raw.recv()) == ["special-l"]
    [status] = ads.cache.status()
    assert (status.node_id, status.stream_kind) == ("n1", "delta")


async def test_rule_2_delta_request_without_type_url_ends_stream(ads: Ads) -> None:
    raw = ads.delta()
    await raw.send(node=ads.node("n"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(raw.call.read(), 5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_rule_3_versions_and_nonces(ads: Ads) -> None:
    snap = snapshot(["a", "b"])
    ads.cache.set_snapshot(snap)
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    cds = await raw.recv()
    assert cds.system_version_info == snap.version(CLUSTER)
    versions = {r.name: r.version for r in cds.resources}
    assert versions["a"] == snapshot(["a"]).resources(CLUSTER)["a"].version
    await raw.send(type_url=ENDPOINT, resource_names_subscribe=["a"])
    eds = await raw.recv()
    assert eds.nonce != cds.nonce


async def test_rule_4_5_delta_nack_not_resent(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a"]))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    bad = snapshot(["a", "bad"])
    ads.cache.set_snapshot(bad)
    rejected = await raw.recv()
    assert names_of(rejected) == ["bad"]
    await raw.send(type_url=CLUSTER, response_nonce=rejected.nonce, error="bad cluster")
    await raw.quiet()
    # Same content again (new object), or another type changing: not resent.
    ads.cache.set_snapshot(snapshot(["a", "bad"]))
    ads.cache.set_snapshot(snapshot(["a", "bad"], routes={"r": "v9"}))
    await raw.quiet()
    [status] = ads.cache.status()
    assert status.to_dict()["nacks"][CLUSTER]["version"] == bad.version(CLUSTER)
    # The config changes: what the client lacks is sent with the change.
    ads.cache.set_snapshot(snapshot(["a", "bad", "c"]))
    response = await raw.recv()
    assert sorted(names_of(response)) == ["bad", "c"]


async def test_rule_6_delta_applies_subscriptions_with_stale_nonce(ads: Ads) -> None:
    ads.cache.set_snapshot(Snapshot.from_resources({ENDPOINT: [cla("a"), cla("b")]}))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=ENDPOINT, resource_names_subscribe=["a"])
    one = await raw.recv()
    await raw.ack(one)
    ads.cache.set_snapshot(Snapshot.from_resources({ENDPOINT: [cla("a", 1), cla("b")]}))
    two = await raw.recv()
    assert names_of(two) == ["a"]
    # Stale nonce (one, not two), yet the subscription change applies.
    await raw.send(type_url=ENDPOINT, response_nonce=one.nonce,
                   resource_names_unsubscribe=["a"], resource_names_subscribe=["b"])  # fmt: skip
    three = await raw.recv()
    assert names_of(three) == ["b"] and not three.removed_resources
    await raw.ack(two)
    await raw.ack(three)
    # a is no longer wanted: its changes are not sent, b's are.
    ads.cache.set_snapshot(Snapshot.from_resources({ENDPOINT: [cla("a", 2), cla("b", 2)]}))
    assert names_of(await raw.recv()) == ["b"]


async def test_rule_7_delta_sends_only_changed_resources(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b", "c"]))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    ads.cache.set_snapshot(snapshot(["a", "b", "c"]))
    await raw.quiet()
    changed = Snapshot.from_resources({
        CLUSTER: [cluster("a"), cluster("b", 5), cluster("c")],
        ENDPOINT: [cla(c) for c in "abc"],
    })  # fmt: skip
    ads.cache.set_snapshot(changed)
    response = await raw.recv()
    assert names_of(response) == ["b"] and not response.removed_resources
    assert response.system_version_info == changed.version(CLUSTER)


async def test_rule_8_13_delta_deletions_use_removed_resources(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b"]))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=ENDPOINT, resource_names_subscribe=["a", "b"])
    await raw.ack(await raw.recv())
    ads.cache.set_snapshot(snapshot(["a"]))
    response = await raw.recv()
    assert list(response.removed_resources) == ["b"] and not response.resources


async def test_rule_9_delta_wildcard(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b"]))
    legacy = ads.delta()
    await legacy.send(node=ads.node("w"), type_url=CLUSTER)
    assert sorted(names_of(await legacy.recv())) == ["a", "b"]
    # An explicit name on a legacy wildcard stream adds to "*"...
    await legacy.send(type_url=CLUSTER, resource_names_subscribe=["a"])
    assert names_of(await legacy.recv()) == ["a"]
    # ...and dropping "*" leaves just a: b's changes are no longer sent.
    await legacy.send(type_url=CLUSTER, resource_names_unsubscribe=["*"])
    await legacy.quiet()
    ads.cache.set_snapshot(Snapshot.from_resources({
        CLUSTER: [cluster("a", 7), cluster("b", 7), cluster("c")],
        ENDPOINT: [cla(c) for c in "abc"],
    }))  # fmt: skip
    assert names_of(await legacy.recv()) == ["a"]
    await legacy.quiet()
    # No legacy wildcard for EDS.
    eds = ads.delta()
    await eds.send(node=ads.node("e"), type_url=ENDPOINT)
    await eds.quiet()


async def test_rule_9_delta_wildcard_on_an_empty_type_is_answered(ads: Ads) -> None:
    # Envoy starts its listeners only after its first CDS answer; without one it
    # waits out CDS's initial_fetch_timeout (15 s), as it did for a snapshot without
    # clusters in test_envoy_ecds_e2e.py before this rule.
    ads.cache.set_snapshot(Snapshot.from_resources({LISTENER: [listener("l", "r")],
                                                    ROUTE: [route("r")]}))  # fmt: skip
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    empty = await raw.recv()
    assert empty.type_url == CLUSTER
    assert list(empty.resources) == [] and list(empty.removed_resources) == []
    await raw.ack(empty)
    await raw.send(type_url=LISTENER)
    assert names_of(await raw.recv()) == ["l"]


async def test_rule_9_unsubscribe_name_also_in_wildcard(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a"]))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=CLUSTER, resource_names_subscribe=["*", "a", "z"])
    first = await raw.recv()
    assert names_of(first) == ["a"] and list(first.removed_resources) == ["z"]
    await raw.ack(first)
    # a stays (covered by "*"), z does not exist: the client is told which.
    await raw.send(type_url=CLUSTER, resource_names_unsubscribe=["a", "z"])
    response = await raw.recv()
    assert names_of(response) == ["a"] and list(response.removed_resources) == ["z"]


async def test_rule_10_delta_resend_requested_and_absent_names(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a"]))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=ENDPOINT, resource_names_subscribe=["a", "c"])
    first = await raw.recv()
    # c does not exist yet: said so once, in removed_resources.
    assert names_of(first) == ["a"] and list(first.removed_resources) == ["c"]
    await raw.ack(first)
    # Subscribing again to what the client has: still sent (it may have forgotten).
    await raw.send(type_url=ENDPOINT, resource_names_subscribe=["a"])
    assert names_of(await raw.recv()) == ["a"]
    ads.cache.set_snapshot(snapshot(["a", "c"]))
    appeared = await raw.recv()
    assert names_of(appeared) == ["c"] and not appeared.removed_resources


async def test_rule_11_delta_no_duplicates(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a"]))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=CLUSTER, resource_names_subscribe=["*", "a", "a"])
    assert names_of(await raw.recv()) == ["a"]


async def test_rule_12_delta_order_and_stale_removal_last(ads: Ads) -> None:
    def snap(clusters: list[str], target: str, port: int) -> Snapshot:
        return Snapshot.from_resources({
            CLUSTER: [cluster(c) for c in clusters],
            ENDPOINT: [cla(c) for c in clusters],
            LISTENER: [listener("l", "r", port)],
            ROUTE: [route("r", target=target)],
        })  # fmt: skip

    ads.cache.set_snapshot(snap(["a", "old"], "old", 10000))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ENDPOINT, resource_names_subscribe=["a", "old"])
    await raw.ack(await raw.recv())
    await raw.send(type_url=LISTENER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ROUTE, resource_names_subscribe=["r"])
    await raw.ack(await raw.recv())

    ads.cache.set_snapshot(snap(["a", "new"], "new", 10001))
    seen = []

    def note(response: Any) -> None:
        seen.append((response.type_url, names_of(response), list(response.removed_resources)))

    upsert = await raw.recv()
    note(upsert)
    # Like Envoy: subscribe to the new cluster's endpoints, then ACK CDS.
    await raw.send(type_url=ENDPOINT, resource_names_subscribe=["new"])
    reactive = await raw.recv()
    note(reactive)
    await raw.ack(reactive)
    await raw.quiet(0.1)  # LDS waits for the CDS answer
    await raw.ack(upsert)
    for _ in range(2):
        response = await raw.recv()
        note(response)
        await raw.quiet(0.1)  # each step waits for the answer to the last
        await raw.ack(response)
    # Removals go last, together.
    for _ in range(2):
        response = await raw.recv()
        note(response)
        await raw.ack(response)
    assert seen == [
        (CLUSTER, ["new"], []),
        (ENDPOINT, ["new"], []),
        (LISTENER, ["l"], []),
        (ROUTE, ["r"], []),
        (CLUSTER, [], ["old"]),
        (ENDPOINT, [], ["old"]),
    ]
    await raw.quiet()


async def test_rule_12_delta_changed_cluster_gets_endpoints_again(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b"]))
    raw = ads.delta()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ENDPOINT, resource_names_subscribe=["a", "b"])
    await raw.ack(await raw.recv())
    ads.cache.set_snapshot(
        Snapshot.from_resources({
            CLUSTER: [cluster("a"), cluster("b", timeout_s=9)],
            ENDPOINT: [cla("a"), cla("b")],
        })
    )  # fmt: skip
    cds, eds = await raw.recv(), await raw.recv()
    assert (cds.type_url, names_of(cds)) == (CLUSTER, ["b"])
    assert (eds.type_url, names_of(eds)) == (ENDPOINT, ["b"])


async def test_rule_13_initial_resource_versions_honoured(ads: Ads) -> None:
    snap = snapshot(["a", "b", "c"])
    ads.cache.set_snapshot(snap)
    versions = {n: e.version for n, e in snap.resources(CLUSTER).items()}
    raw = ads.delta()
    await raw.send(
        node=ads.node("n"), type_url=CLUSTER,
        initial_resource_versions={"a": versions["a"], "b": "stale", "gone": "x"},
    )  # fmt: skip
    response = await raw.recv()
    # a is current (not resent), b stale, c missing, gone deleted.
    assert sorted(names_of(response)) == ["b", "c"]
    assert list(response.removed_resources) == ["gone"]
    await raw.ack(response)
    await raw.quiet()
    # Explicit names on reconnect: only the one whose version differs.
    eds = ads.delta()
    eds_versions = {n: e.version for n, e in snap.resources(ENDPOINT).items()}
    await eds.send(
        node=ads.node("m"), type_url=ENDPOINT, resource_names_subscribe=["a", "b"],
        initial_resource_versions={"a": eds_versions["a"], "b": "old"},
    )  # fmt: skip
    assert names_of(await eds.recv()) == ["b"]
