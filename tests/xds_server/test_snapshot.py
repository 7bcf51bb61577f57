"""Snapshot: names, content-hash versions (rule 3) and duplicate names (rule 11)."""

from __future__ import annotations

import pytest

from sluicegate.xds.resource import CLUSTER, ENDPOINT, LISTENER, ROUTE
from sluicegate.xds.server import Snapshot

from .helpers import cla, cluster, route, snapshot


def test_names_come_from_name_or_cluster_name() -> None:
    snap = Snapshot.from_resources({CLUSTER: [cluster("a")], ENDPOINT: [cla("a")]})
    assert snap.names(CLUSTER) == ["a"]
    assert snap.names(ENDPOINT) == ["a"]
    assert snap.get(ENDPOINT, "a").cluster_name == "a"
    assert snap.get(CLUSTER, "missing") is None


def test_rule_3_versions_hash_content_not_identity() -> None:
    one, two = snapshot(["a", "b"]), snapshot(["b", "a"])
    assert one.version() == two.version()
    assert one.versions() == two.versions()
    changed = snapshot(["a", "b"], routes={"r": "v2"})
    assert changed.version(ROUTE) != one.version(ROUTE)
    assert changed.version(CLUSTER) == one.version(CLUSTER)
    assert changed.version() != one.version()
    # A type the snapshot lacks has the version of an empty type.
    empty = Snapshot.from_resources({LISTENER: []})
    assert one.version("type.googleapis.com/x.Y") == empty.version(LISTENER)
    assert one.type_urls() == {CLUSTER, ENDPOINT, ROUTE, LISTENER}


def test_rule_11_duplicate_names_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        Snapshot.from_resources({CLUSTER: [cluster("a"), cluster("a", timeout_s=2)]})
    with pytest.raises(ValueError, match="duplicate"):
        Snapshot.from_resources({ENDPOINT: [cla("a", 1), cla("a", 2)]})
    # The same name under two types is fine.
    Snapshot.from_resources({CLUSTER: [cluster("a")], ROUTE: [route("a")]})


def test_wrong_type_or_empty_name_rejected() -> None:
    with pytest.raises(ValueError, match="cannot be listed"):
        Snapshot.from_resources({ROUTE: [cluster("a")]})
    with pytest.raises(ValueError, match="without a name"):
        Snapshot.from_resources({CLUSTER: [cluster("")]})
