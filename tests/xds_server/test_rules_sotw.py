"""The xDS rules of docs/xds-rules.md (1-13) on state-of-the-world ADS, over raw gRPC."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from sluicegate.xds.resource import CLUSTER, ENDPOINT, LISTENER, ROUTE
from sluicegate.xds.server import Snapshot

from .helpers import Ads, cla, cluster, listener, names_of, route, snapshot


async def test_rule_1_node_only_on_first_request_is_remembered(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["shared"], listeners={"shared-l": "r"}))
    ads.cache.set_snapshot(snapshot(["special"], listeners={"special-l": "r"}), node_id="n1")
    raw = ads.sotw()
    await raw.send(node=ads.node("n1"), type_url=CLUSTER)
    assert names_of(await raw.recv()) == ["special"]
    # No node on later requests: the stream still belongs to n1.
    await raw.send(type_url=LISTENER)
    assert names_of(await raw.recv()) == ["special-l"]
    [status] = ads.cache.status()
    assert (status.node_id, status.cluster, status.stream_kind) == ("n1", "test-cluster", "sotw")
    # The default snapshot changing does not concern n1's stream.
    ads.cache.set_snapshot(snapshot(["shared", "more"]))
    await raw.quiet()


async def test_rule_2_request_without_type_url_ends_stream(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot())
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url="")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(raw.call.read(), 5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_rule_3_nonces_unique_versions_survive_reconnect(ads: Ads) -> None:
    snap = snapshot(["a", "b"])
    ads.cache.set_snapshot(snap)
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    cds = await raw.recv()
    await raw.send(type_url=ENDPOINT, resource_names=["a", "b"])
    eds = await raw.recv()
    assert cds.version_info == snap.version(CLUSTER)
    assert eds.version_info == snap.version(ENDPOINT)
    nonces = {cds.nonce, eds.nonce}
    await raw.ack(cds)
    await raw.ack(eds, ["a", "b"])
    ads.cache.set_snapshot(snapshot(["a", "b", "c"]))
    cds2 = await raw.recv()
    nonces.add(cds2.nonce)
    assert len(nonces) == 3
    await raw.ack(cds2)
    raw.close()
    # A new stream presenting the version it holds gets nothing resent...
    again = ads.sotw()
    await again.send(node=ads.node("n"), type_url=CLUSTER, version_info=cds2.version_info)
    await again.send(type_url=ENDPOINT, resource_names=["a", "b"], version_info=eds.version_info)
    await again.quiet()
    # ...but a name it did not have before is new, so EDS is answered.
    await again.send(type_url=ENDPOINT, resource_names=["a", "b", "c"],
                     version_info=eds.version_info)  # fmt: skip
    assert names_of(await again.recv()) == ["c"]
    # And a client with an unknown version gets the full state.
    fresh = ads.sotw()
    await fresh.send(node=ads.node("m"), type_url=CLUSTER, version_info="not-a-version")
    assert sorted(names_of(await fresh.recv())) == ["a", "b", "c"]


async def test_rule_4_5_nack_recorded_and_not_resent(ads: Ads) -> None:
    good = snapshot(["a"])
    ads.cache.set_snapshot(good)
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    first = await raw.recv()
    await raw.ack(first)
    bad = snapshot(["a", "bad"])
    ads.cache.set_snapshot(bad)
    rejected = await raw.recv()
    assert rejected.version_info == bad.version(CLUSTER)
    # Rule 4: a NACK carries error_detail and the last accepted version.
    # Envoy quotes the rejected config as text, secrets included (`sensitive` is ignored):
    # the log and /status keep none of them.
    error = 'cluster bad: invalid lb in credentials { key: "sk-sg-LEAK" client: "fast/t/k" }'
    await raw.send(type_url=CLUSTER, version_info=first.version_info,
                   response_nonce=rejected.nonce, error=error)  # fmt: skip
    await raw.quiet()
    [status] = ads.cache.status()
    nack = status.to_dict()["nacks"][CLUSTER]
    assert nack["version"] == bad.version(CLUSTER)
    assert "invalid lb" in nack["message"]
    assert "sk-sg-LEAK" not in nack["message"] and 'key: "[redacted]"' in nack["message"]
    assert status.acked_versions()[CLUSTER] == good.version(CLUSTER)
    json.dumps(status.to_dict())
    assert ads.cache.ads_status.nacks_total[CLUSTER] == 1
    # Rule 5: neither a repeated request, nor the same config again, nor a
    # change of another type brings it back (and what builds on it is held).
    await raw.send(type_url=CLUSTER, version_info=first.version_info,
                   response_nonce=rejected.nonce)  # fmt: skip
    ads.cache.set_snapshot(snapshot(["a", "bad"]))
    ads.cache.set_snapshot(snapshot(["a", "bad"], routes={"r": "v9"}))
    await raw.quiet()
    # A changed config is sent, and its ACK clears the live error.
    fixed = snapshot(["a", "fixed"])
    ads.cache.set_snapshot(fixed)
    response = await raw.recv()
    assert sorted(names_of(response)) == ["a", "fixed"]
    await raw.ack(response)
    await raw.quiet()
    [status] = ads.cache.status()
    assert status.to_dict()["nacks"] == {}
    assert status.acked_versions()[CLUSTER] == fixed.version(CLUSTER)
    assert status.to_dict()["last_nacks"][CLUSTER]["count"] == 1


async def test_rule_5_nack_holds_the_rest_of_the_push(ads: Ads) -> None:
    """Make before break: LDS/RDS that follow a rejected CDS are not pushed."""
    ads.cache.set_snapshot(snapshot(["a"]))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ROUTE, resource_names=["r"])
    await raw.ack(await raw.recv(), ["r"])
    ads.cache.set_snapshot(snapshot(["a", "b"], routes={"r": "v2"}))
    cds = await raw.recv()
    assert cds.type_url == CLUSTER
    await raw.send(type_url=CLUSTER, response_nonce=cds.nonce, error="no")
    await raw.quiet()
    # The next config change carries both.
    ads.cache.set_snapshot(snapshot(["a", "c"], routes={"r": "v2"}))
    cds = await raw.recv()
    assert cds.type_url == CLUSTER
    await raw.ack(cds)
    rds = await raw.recv()
    assert rds.type_url == ROUTE


async def test_rule_6_stale_nonce_ignored(ads: Ads) -> None:
    ads.cache.set_snapshot(Snapshot.from_resources({ENDPOINT: [cla("a"), cla("b")]}))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=ENDPOINT, resource_names=["a"])
    one = await raw.recv()
    await raw.ack(one, ["a"])
    ads.cache.set_snapshot(Snapshot.from_resources({ENDPOINT: [cla("a", 1), cla("b")]}))
    two = await raw.recv()
    # Sent before the client saw `two`: its nonce is stale, so it is ignored.
    await raw.send(type_url=ENDPOINT, resource_names=["a", "b"], response_nonce=one.nonce,
                   version_info=one.version_info)  # fmt: skip
    await raw.quiet()
    # The same wish with the latest nonce is answered, with the new name only.
    await raw.send(type_url=ENDPOINT, resource_names=["a", "b"], response_nonce=two.nonce,
                   version_info=two.version_info)  # fmt: skip
    assert names_of(await raw.recv()) == ["b"]


async def test_rule_7_only_real_changes_are_sent(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a"]))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ENDPOINT, resource_names=["a"])
    await raw.ack(await raw.recv(), ["a"])
    await raw.send(type_url=LISTENER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ROUTE, resource_names=["r"])
    rds = await raw.recv()
    await raw.ack(rds, ["r"])
    # ACKs, repeated requests and a snapshot with equal content send nothing.
    await raw.ack(rds, ["r"])
    await raw.send(type_url=ROUTE, resource_names=["r"], response_nonce=rds.nonce)
    ads.cache.set_snapshot(snapshot(["a"]))
    await raw.quiet()
    # Only the changed type is sent.
    ads.cache.set_snapshot(snapshot(["a"], routes={"r": "v2"}))
    response = await raw.recv()
    assert response.type_url == ROUTE
    await raw.ack(response, ["r"])
    await raw.quiet()


async def test_rule_8_full_state_for_cds_subset_for_eds(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b"]))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ENDPOINT, resource_names=["a", "b"])
    assert sorted(names_of(await raw.recv())) == ["a", "b"]
    # Only cluster a and endpoints a change.
    changed = Snapshot.from_resources({
        CLUSTER: [cluster("a", timeout_s=3), cluster("b")],
        ENDPOINT: [cla("a", 9001), cla("b")],
    })  # fmt: skip
    ads.cache.set_snapshot(changed)
    cds = await raw.recv()
    assert cds.type_url == CLUSTER and sorted(names_of(cds)) == ["a", "b"]
    await raw.ack(cds)
    eds = await raw.recv()
    assert eds.type_url == ENDPOINT and names_of(eds) == ["a"]


async def test_rule_9_wildcard_and_unsubscribe(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b"]))
    wildcard = ads.sotw()
    await wildcard.send(node=ads.node("w"), type_url=CLUSTER)
    await wildcard.ack(await wildcard.recv())
    star = ads.sotw()
    await star.send(node=ads.node("s"), type_url=CLUSTER, resource_names=["*"])
    await star.ack(await star.recv(), ["*"])
    named = ads.sotw()
    await named.send(node=ads.node("x"), type_url=CLUSTER, resource_names=["a"])
    only_a = await named.recv()
    assert names_of(only_a) == ["a"]
    # Empty list after names: unsubscribed from everything.
    await named.send(type_url=CLUSTER, resource_names=[], response_nonce=only_a.nonce,
                     version_info=only_a.version_info)  # fmt: skip
    # No legacy wildcard for EDS: an empty first request wants nothing.
    eds = ads.sotw()
    await eds.send(node=ads.node("e"), type_url=ENDPOINT)
    await eds.quiet()
    ads.cache.set_snapshot(snapshot(["a", "b", "c"]))
    assert sorted(names_of(await wildcard.recv())) == ["a", "b", "c"]
    assert sorted(names_of(await star.recv())) == ["a", "b", "c"]
    await named.quiet()
    await eds.quiet()


async def test_rule_10_new_names_sent_missing_names_remembered(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b"]))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=ENDPOINT, resource_names=["a", "b"])
    both = await raw.recv()
    await raw.ack(both, ["a", "b"])
    await raw.send(type_url=ENDPOINT, resource_names=["a"], response_nonce=both.nonce)
    await raw.quiet()
    # b is unchanged, but newly requested again: it is sent.
    await raw.send(type_url=ENDPOINT, resource_names=["a", "b", "c"], response_nonce=both.nonce)
    again = await raw.recv()
    assert names_of(again) == ["b"]
    await raw.ack(again, ["a", "b", "c"])
    await raw.quiet()
    # c did not exist; it is pushed when it appears.
    ads.cache.set_snapshot(snapshot(["a", "b", "c"]))
    assert names_of(await raw.recv()) == ["c"]


async def test_rule_11_no_duplicate_names_in_a_response(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a"]))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=ENDPOINT, resource_names=["a", "a", "b"])
    first = await raw.recv()
    assert names_of(first) == ["a"]
    await raw.ack(first, ["a", "b"])
    ads.cache.set_snapshot(snapshot(["a", "b"], endpoints={"a": 1, "b": 2}))
    second = await raw.recv()
    assert sorted(names_of(second)) == ["a", "b"]


async def test_rule_12_push_order_cds_eds_lds_rds_each_after_ack(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a"]))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ENDPOINT, resource_names=["a"])
    await raw.ack(await raw.recv(), ["a"])
    await raw.send(type_url=LISTENER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ROUTE, resource_names=["r"])
    await raw.ack(await raw.recv(), ["r"])
    changed = Snapshot.from_resources({
        ROUTE: [route("r", "v2")],
        LISTENER: [listener("l", "r", port=10001)],
        ENDPOINT: [cla("a", 9001)],
        CLUSTER: [cluster("a", timeout_s=2)],
    })  # fmt: skip
    ads.cache.set_snapshot(changed)
    # CDS and EDS go together: Envoy ACKs a changed cluster only once it has
    # its endpoints again.
    cds, eds = await raw.recv(), await raw.recv()
    assert (cds.type_url, eds.type_url) == (CLUSTER, ENDPOINT)
    await raw.quiet(0.1)  # LDS waits for the answer
    await raw.ack(cds)
    await raw.ack(eds, ["a"])
    lds = await raw.recv()
    assert lds.type_url == LISTENER
    await raw.quiet(0.1)  # RDS waits for the answer
    await raw.ack(lds)
    rds = await raw.recv()
    assert rds.type_url == ROUTE
    await raw.ack(rds, ["r"])
    await raw.quiet()


async def test_rule_12_changed_cluster_gets_unchanged_endpoints_again(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b"]))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ENDPOINT, resource_names=["a", "b"])
    await raw.ack(await raw.recv(), ["a", "b"])
    # Only cluster a changes; its (unchanged) endpoints follow it, b's do not.
    ads.cache.set_snapshot(
        Snapshot.from_resources({
            CLUSTER: [cluster("a", timeout_s=9), cluster("b")],
            ENDPOINT: [cla("a"), cla("b")],
        })
    )  # fmt: skip
    cds, eds = await raw.recv(), await raw.recv()
    assert cds.type_url == CLUSTER and eds.type_url == ENDPOINT
    assert names_of(eds) == ["a"]


async def test_rule_12_stale_clusters_removed_last(ads: Ads) -> None:
    def snap(clusters: list[str], target: str) -> Snapshot:
        return Snapshot.from_resources({
            CLUSTER: [cluster(c) for c in clusters],
            ENDPOINT: [cla(c) for c in clusters],
            LISTENER: [listener("l", "r")],
            ROUTE: [route("r", target=target)],
        })  # fmt: skip

    ads.cache.set_snapshot(snap(["a", "old"], "old"))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ENDPOINT, resource_names=["a", "old"])
    eds = await raw.recv()
    await raw.ack(eds, ["a", "old"])
    await raw.send(type_url=LISTENER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=ROUTE, resource_names=["r"])
    await raw.ack(await raw.recv(), ["r"])

    ads.cache.set_snapshot(snap(["a", "new"], "new"))
    union = await raw.recv()
    assert union.type_url == CLUSTER and sorted(names_of(union)) == ["a", "new", "old"]
    # Like Envoy: ask for the new cluster's endpoints, then ACK CDS.
    await raw.send(type_url=ENDPOINT, resource_names=["a", "new", "old"],
                   response_nonce=eds.nonce, version_info=eds.version_info)  # fmt: skip
    eds = await raw.recv()
    assert eds.type_url == ENDPOINT and names_of(eds) == ["new"]
    await raw.ack(union)
    await raw.ack(eds, ["a", "new", "old"])
    rds = await raw.recv()
    assert rds.type_url == ROUTE and rds.resources[0].value.count(b"new")
    await raw.ack(rds, ["r"])
    final = await raw.recv()
    assert final.type_url == CLUSTER and sorted(names_of(final)) == ["a", "new"]
    await raw.ack(final)
    await raw.quiet()


async def test_rule_9_narrowed_subscription_shows_as_current_in_status(ads: Ads) -> None:
    ads.cache.set_snapshot(snapshot(["a", "b"]))
    raw = ads.sotw()
    await raw.send(node=ads.node("n"), type_url=CLUSTER)
    cds = await raw.recv()
    await raw.ack(cds)
    await raw.send(type_url=ENDPOINT, resource_names=["a", "b"])
    eds = await raw.recv()
    await raw.ack(eds, ["a", "b"])
    # Cluster b goes away; the client drops b's endpoints from its subscription and
    # nothing needs sending, yet status must show EDS at the new snapshot's version.
    narrower = snapshot(["a"])
    ads.cache.set_snapshot(narrower)
    cds2 = await raw.recv()
    await raw.ack(cds2)
    await raw.send(type_url=ENDPOINT, resource_names=["a"], version_info=eds.version_info,
                   response_nonce=eds.nonce)  # fmt: skip
    await raw.quiet()
    [status] = ads.cache.status()
    assert status.acked_versions()[ENDPOINT] == narrower.version(ENDPOINT)
    assert status.acked_versions()[CLUSTER] == narrower.version(CLUSTER)
