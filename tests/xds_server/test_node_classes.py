"""Node classes: nodes sorted by what they say of themselves get a snapshot of their
own (SnapshotCache.sort_nodes_by), over both ADS flavours."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2

from sluicegate.xds.resource import CLUSTER, LISTENER
from sluicegate.xds.server import Snapshot

from .helpers import Ads, names_of, snapshot


class ByCluster:
    """Puts a node whose cluster is "special" in class "special"; notes the NACKs."""

    def __init__(self, made: Snapshot | None) -> None:
        self.made = made
        self.asked: list[str] = []
        self.nacks: list[tuple[str, str, str, str]] = []

    def class_of(self, node: Any, first: bool) -> str | None:
        return "special" if node.cluster == "special" else None

    def snapshot_of(self, node_class: str) -> Snapshot | None:
        self.asked.append(node_class)
        return self.made

    def nacked(self, node_id: str, node_class: str, type_url: str, message: str) -> None:
        self.nacks.append((node_id, node_class, type_url, message))


def _node(node_id: str, cluster: str) -> Any:
    return base_pb2.Node(id=node_id, cluster=cluster)


async def _until_no_class_is_left(ads: Ads) -> None:
    """Closed streams end on the server a moment later; then their nodes' classes go."""
    for _ in range(50):
        if not ads.cache.node_classes():
            return
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("flavour", ["sotw", "delta"])
async def test_a_class_gets_its_own_snapshot_from_its_first_answer(ads: Ads, flavour: str) -> None:
    classes = ByCluster(snapshot(["special"]))
    ads.cache.sort_nodes_by(classes)
    ads.cache.set_snapshot(snapshot(["shared"]))
    plain, special = (ads.sotw(), ads.sotw()) if flavour == "sotw" else (ads.delta(), ads.delta())
    names = {"resource_names_subscribe": []} if flavour == "delta" else {}
    await plain.send(node=_node("p", "plain"), type_url=CLUSTER, **names)
    await special.send(node=_node("s", "special"), type_url=CLUSTER, **names)
    assert names_of(await plain.recv()) == ["shared"]
    assert names_of(await special.recv()) == ["special"]  # never the default first
    assert classes.asked == ["special"]
    assert {s.node_id: s.to_dict()["class"] for s in ads.cache.status()} == {
        "p": None, "s": "special"
    }  # fmt: skip
    # The default changing wakes only the default's nodes; the class's, only its own.
    ads.cache.set_snapshot(snapshot(["shared", "more"]))
    assert "more" in names_of(await plain.recv())
    await special.quiet()
    ads.cache.set_class_snapshot("special", snapshot(["special", "two"]))
    assert "two" in names_of(await special.recv())
    await plain.quiet()
    assert ads.cache.node_classes() == {"special"}


async def test_a_class_without_a_snapshot_yet_gets_the_default(ads: Ads) -> None:
    ads.cache.sort_nodes_by(ByCluster(None))
    ads.cache.set_snapshot(snapshot(["shared"]))
    raw = ads.sotw()
    await raw.send(node=_node("s", "special"), type_url=CLUSTER)
    first = await raw.recv()
    assert names_of(first) == ["shared"]
    await raw.ack(first)
    ads.cache.set_class_snapshot("special", snapshot(["special"]))
    assert "special" in names_of(await raw.recv())


async def test_a_nack_reaches_the_sorter_and_a_node_moved_to_the_default_gets_it(
    ads: Ads,
) -> None:
    classes = ByCluster(snapshot(["a"], listeners={"special-l": "r"}))
    ads.cache.sort_nodes_by(classes)
    ads.cache.set_snapshot(snapshot(["a"], listeners={"l": "r"}))
    raw = ads.sotw()
    await raw.send(node=_node("s", "special"), type_url=CLUSTER)
    await raw.ack(await raw.recv())
    await raw.send(type_url=LISTENER)
    rejected = await raw.recv()
    assert names_of(rejected) == ["special-l"]
    await raw.send(type_url=LISTENER, response_nonce=rejected.nonce, error="cannot load it")
    await raw.quiet()
    assert classes.nacks == [("s", "special", LISTENER, "cannot load it")]
    ads.cache.reclassify("s", None)
    assert names_of(await raw.recv()) == ["l"]
    [status] = ads.cache.status()
    assert status.node_class is None


async def test_a_class_no_node_is_in_is_forgotten(ads: Ads) -> None:
    classes = ByCluster(snapshot(["special"]))
    ads.cache.sort_nodes_by(classes)
    ads.cache.set_snapshot(snapshot(["shared"]))
    raw = ads.sotw()
    await raw.send(node=_node("s", "special"), type_url=CLUSTER)
    assert names_of(await raw.recv()) == ["special"]
    raw.close()
    await _until_no_class_is_left(ads)
    assert ads.cache.node_classes() == set()
    # The next node of it makes the class's snapshot again (it may have changed).
    again = ads.sotw()
    await again.send(node=_node("s2", "special"), type_url=CLUSTER)
    assert names_of(await again.recv()) == ["special"]
    assert classes.asked == ["special", "special"]


async def test_a_class_its_last_node_left_is_made_afresh_for_the_next(ads: Ads) -> None:
    """A node moved out of its class leaves no snapshot behind that nobody publishes."""
    classes = ByCluster(snapshot(["special"]))
    ads.cache.sort_nodes_by(classes)
    ads.cache.set_snapshot(snapshot(["shared"]))
    first = ads.sotw()
    await first.send(node=_node("a", "special"), type_url=CLUSTER)
    assert names_of(await first.recv()) == ["special"]
    ads.cache.reclassify("a", None)
    assert "shared" in names_of(await first.recv())
    assert ads.cache.node_classes() == set()
    classes.made = snapshot(["special", "newer"])
    second = ads.sotw()
    await second.send(node=_node("b", "special"), type_url=CLUSTER)
    assert sorted(names_of(await second.recv())) == ["newer", "special"]
    assert classes.asked == ["special", "special"]


async def test_a_second_stream_of_a_node_that_says_otherwise_moves_the_node(ads: Ads) -> None:
    ads.cache.sort_nodes_by(ByCluster(snapshot(["special"])))
    ads.cache.set_snapshot(snapshot(["shared"]))
    first = ads.sotw()
    await first.send(node=_node("n", "plain"), type_url=CLUSTER)
    await first.ack(await first.recv())
    second = ads.sotw()
    await second.send(node=_node("n", "special"), type_url=CLUSTER)
    assert names_of(await second.recv()) == ["special"]
    assert "special" in names_of(await first.recv())  # woken: its node moved


class Recording(ByCluster):
    """Notes `first` as the cache gives it; can be made to fail making a snapshot."""

    def __init__(self, made: Snapshot | None) -> None:
        super().__init__(made)
        self.firsts: list[bool] = []
        self.fail = False

    def class_of(self, node: Any, first: bool) -> str | None:
        self.firsts.append(first)
        return super().class_of(node, first)

    def snapshot_of(self, node_class: str) -> Snapshot | None:
        if self.fail:
            raise RuntimeError("cannot translate")
        return super().snapshot_of(node_class)


async def test_first_means_no_stream_of_the_node_is_open(ads: Ads) -> None:
    classes = Recording(snapshot(["special"]))
    ads.cache.sort_nodes_by(classes)
    ads.cache.set_snapshot(snapshot(["shared"]))
    one, two = ads.sotw(), ads.sotw()
    await one.send(node=_node("n", "special"), type_url=CLUSTER)
    await one.recv()
    await two.send(node=_node("n", "special"), type_url=CLUSTER)
    await two.recv()
    one.close()
    await asyncio.sleep(0.2)
    three = ads.sotw()
    await three.send(node=_node("n", "special"), type_url=CLUSTER)
    await three.recv()
    two.close()
    three.close()
    await _until_no_class_is_left(ads)
    four = ads.sotw()
    await four.send(node=_node("n", "special"), type_url=CLUSTER)
    await four.recv()
    assert classes.firsts == [True, False, False, True]


async def test_a_class_whose_snapshot_cannot_be_made_serves_the_default(ads: Ads) -> None:
    classes = Recording(snapshot(["special"]))
    classes.fail = True
    ads.cache.sort_nodes_by(classes)
    ads.cache.set_snapshot(snapshot(["shared"]))
    raw = ads.sotw()
    await raw.send(node=_node("s", "special"), type_url=CLUSTER)
    assert names_of(await raw.recv()) == ["shared"]
    assert ads.cache.node_classes() == set()
