"""Each Envoy its own native filters library (stack/native_nodes.py): an Envoy whose
bootstrap names one is served listeners that load it, the others Envoy's own filters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from sluicegate.envoy import make_bootstrap
from sluicegate.stack.control_plane import ControlPlane
from sluicegate.stack.native_nodes import (
    CRASH_HOLD_S,
    CRASH_STARTS,
    CRASH_WINDOW_S,
    MAX_LIBRARIES,
    MAX_REFUSED,
)
from sluicegate.stack.status_http import status_document
from sluicegate.xds.resource import CLUSTER, ENDPOINT, EXTENSION_CONFIG, LISTENER
from sluicegate.xds.server import Snapshot, SnapshotCache
from sluicegate.xds.translate import NATIVE_TYPES
from sluicegate.xds.translate.model_reader import MODEL_READER_FILTER
from sluicegate.xds.translate.native import (
    NATIVE_MODEL_READER_FILTER,
    NATIVE_USAGE_READER_FILTER,
)
from tests.stack.test_control_plane import CONFIG

LIBRARY = "/opt/sluicegate/a/libsluicegate_native.so"
OTHER = "/opt/sluicegate/b/libsluicegate_native.so"


def _plane(tmp_path: Path, extra: str = "", model: str = "m1") -> ControlPlane:
    path = tmp_path / "sluicegate.yaml"
    path.write_text(CONFIG.replace("MODEL", model) + extra)
    plane = ControlPlane(path, SnapshotCache())
    assert plane.load().ok
    return plane


def _node(node_id: str, library: str | None) -> Any:
    """The node a bootstrap naming `library` gives Envoy."""
    node: base_pb2.Node = make_bootstrap(
        node_id, "sluicegate", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:0", native_module=library
    ).node
    return node


def _native_paths(snapshot: Snapshot | None) -> list[str]:
    """The libraries the snapshot's listeners load (one per native filter in them)."""
    assert snapshot is not None
    found = []
    for listener in snapshot.resources(LISTENER).values():
        assert isinstance(listener.message, listener_pb2.Listener)
        manager = hcm_pb2.HttpConnectionManager()
        assert listener.message.filter_chains[0].filters[-1].typed_config.Unpack(manager)
        for http_filter in manager.http_filters:
            if http_filter.name == NATIVE_USAGE_READER_FILTER:
                found.append(str(http_filter.typed_config))
    return [path for path in (LIBRARY, OTHER) for text in found if path in text]


def test_an_envoy_that_names_its_library_is_served_it_and_the_others_not(tmp_path: Path) -> None:
    plane = _plane(tmp_path)
    cache = plane.cache
    for node_id, library in (("a1", LIBRARY), ("a2", LIBRARY), ("b", OTHER), ("plain", None)):
        cache.identify(_node(node_id, library))
    assert _native_paths(cache.get_snapshot("a1")) == [LIBRARY]
    assert cache.get_snapshot("a2") is cache.get_snapshot("a1")  # one class, one snapshot
    assert _native_paths(cache.get_snapshot("b")) == [OTHER]
    assert _native_paths(cache.get_snapshot("plain")) == []
    assert cache.get_snapshot("plain") is plane.snapshot
    # Only the clusters (the header allowlist) and listeners differ, and, where Envoy
    # routes (no tenants: the default lane routes without Python), the model reader's
    # configuration.
    native, default = cache.get_snapshot("a1"), plane.snapshot
    assert native is not None and default is not None
    differ = {t for t in default.type_urls() if native.version(t) != default.version(t)}
    assert differ == set(NATIVE_TYPES)
    readers = {name: str(config.message) for name, config in
               native.resources(EXTENSION_CONFIG).items() if "model_reader" in name}  # fmt: skip
    assert LIBRARY in readers[NATIVE_MODEL_READER_FILTER]
    # The default's Lua reader stays beside it, for connections draining from a listener
    # that names it (a delta stream would remove it).
    assert set(readers) == {NATIVE_MODEL_READER_FILTER, MODEL_READER_FILTER}


def test_a_reload_reaches_every_class_and_another_setting_serves_one_snapshot(
    tmp_path: Path,
) -> None:
    plane = _plane(tmp_path)
    plane.cache.identify(_node("a", LIBRARY))
    before = plane.cache.get_snapshot("a")
    plane.path.write_text(CONFIG.replace("MODEL", "m2"))
    assert plane.load().ok
    after = plane.cache.get_snapshot("a")
    assert after is not None and before is not None and after.version() != before.version()
    assert _native_paths(after) == [LIBRARY]
    for setting in ("off", OTHER):
        plane.path.write_text(
            CONFIG.replace("MODEL", "m2") + f"native_filters: {{module: {setting}}}\n"
        )
        assert plane.load().ok
        served = plane.cache.get_snapshot("a")
        assert served is not None and plane.snapshot is not None
        assert served.version() == plane.snapshot.version()
        assert _native_paths(served) == ([] if setting == "off" else [OTHER])


def test_an_envoy_that_cannot_load_its_library_falls_back_to_envoys_filters(
    tmp_path: Path,
) -> None:
    plane = _plane(tmp_path)
    cache = plane.cache
    cache.identify(_node("a", LIBRARY))
    # A NACK for another reason leaves it be: without the library it would fail alike.
    cache.nacked("a", LISTENER, "Proto constraint validation failed: port")
    assert _native_paths(cache.get_snapshot("a")) == [LIBRARY]
    message = f"Failed to load dynamic module: {LIBRARY}: cannot open shared object file"
    cache.nacked("a", LISTENER, message)
    assert cache.get_snapshot("a") is plane.snapshot
    native = status_document(plane)["native_filters"]
    assert native["setting"] == "node"
    assert native["refused"] == [{"node_id": "a", "path": LIBRARY, "message": message}]
    # Another stream of the same Envoy is not put back in the class it cannot load...
    assert plane.native_nodes.class_of(_node("a", LIBRARY), first=False) is None
    # ... a new Envoy process (no stream of the node left) is given its library again.
    assert plane.native_nodes.class_of(_node("a", LIBRARY), first=True) == LIBRARY
    assert status_document(plane)["native_filters"]["refused"] == []


@pytest.mark.parametrize("type_url", [EXTENSION_CONFIG, CLUSTER])
def test_a_library_that_refuses_its_filters_configuration_falls_back_too(
    tmp_path: Path, type_url: str
) -> None:
    """A library built from other sources than the control plane's (an older one, which
    knows no model reader or no header allowlist): Envoy loads it, refuses the filter's
    configuration, and NACKs the filter configurations (ECDS) or the clusters with these
    words (Envoy 1.40, checked with `envoy --mode validate` on a library built from
    session 20's sources)."""
    plane = _plane(tmp_path)
    cache = plane.cache
    cache.identify(_node("a", LIBRARY))
    message = "Failed to create filter config: Failed to initialize dynamic module"
    cache.nacked("a", type_url, message)
    assert cache.get_snapshot("a") is plane.snapshot
    assert status_document(plane)["native_filters"]["refused"] == [
        {"node_id": "a", "path": LIBRARY, "message": message}
    ]


def test_node_metadata_is_bounded(tmp_path: Path) -> None:
    """Node metadata is what any xDS client says: a path must be absolute and printable,
    and only so many libraries get classes (each is translated on every change)."""
    plane = _plane(tmp_path)
    nodes = plane.native_nodes
    for bad in ("lib.so", "/a\nb.so", "/" + "x" * 5000):
        node = _node("x", None)
        node.metadata.update({"sluicegate": {"native_module": bad}})
        assert nodes.class_of(node, first=True) is None
    for index in range(MAX_LIBRARIES):
        assert plane.cache.identify(_node(f"n{index}", f"/lib/{index}.so")) == f"/lib/{index}.so"
    assert plane.cache.identify(_node("late", "/lib/late.so")) is None
    assert plane.cache.identify(_node("again", "/lib/0.so")) == "/lib/0.so"


def test_an_envoy_that_restarts_again_and_again_is_held_to_envoys_filters(
    tmp_path: Path,
) -> None:
    """A crash in the library takes Envoy down and `up` starts it again on the same
    config: CRASH_STARTS fresh connections within CRASH_WINDOW_S hold the library off
    for CRASH_HOLD_S, fresh connections or not; then it is given again."""
    plane = _plane(tmp_path)
    nodes = plane.native_nodes
    now = [1000.0]
    nodes._clock = lambda: now[0]
    spaced = [nodes.class_of(_node("a", LIBRARY), first=True) for _ in range(CRASH_STARTS - 1)]
    now[0] += CRASH_WINDOW_S + 1  # a slow restart: the count starts over
    assert spaced == [LIBRARY] * (CRASH_STARTS - 1)
    assert nodes.class_of(_node("a", LIBRARY), first=True) == LIBRARY
    # Another stream of the same process is no start.
    assert nodes.class_of(_node("a", LIBRARY), first=False) == LIBRARY
    # With the start after the gap, CRASH_STARTS within the window: held at the last.
    quick = [nodes.class_of(_node("a", LIBRARY), first=True) for _ in range(CRASH_STARTS - 1)]
    assert quick == [LIBRARY] * (CRASH_STARTS - 2) + [None]
    [refused] = status_document(plane)["native_filters"]["refused"]
    assert refused["path"] == LIBRARY and "connected anew" in refused["message"]
    now[0] += CRASH_HOLD_S - 1
    assert nodes.class_of(_node("a", LIBRARY), first=True) is None  # still held
    assert nodes.class_of(_node("b", LIBRARY), first=True) == LIBRARY  # others are not
    # Held even when the refusals it is listed among overflow.
    for index in range(MAX_REFUSED):
        nodes.nacked(f"x{index}", LIBRARY, LISTENER, f"Failed to load dynamic module: {index}")
    assert nodes.class_of(_node("a", LIBRARY), first=False) is None
    now[0] += 2
    assert nodes.class_of(_node("a", LIBRARY), first=True) == LIBRARY


def test_a_weight_tick_reaches_every_class(tmp_path: Path, monkeypatch: Any) -> None:
    """The latency router's pushes (only endpoints change) reach the Envoys with their own
    library too, their listeners kept."""
    latency_route = CONFIG.replace(
        "backends: [{provider: alpha}]",
        "routing: latency, backends: [{provider: alpha, weight: 50}, {provider: beta, weight: 50}]",
    ).replace(
        "providers:\n",
        'providers:\n  - {name: beta, base_url: "http://127.0.0.1:18082/v1"}\n',
    )  # fmt: skip
    path = tmp_path / "sluicegate.yaml"
    path.write_text(latency_route.replace("MODEL", "m1"))
    plane = ControlPlane(path, SnapshotCache())
    assert plane.load().ok
    plane.cache.identify(_node("a", LIBRARY))
    before = plane.cache.get_snapshot("a")
    monkeypatch.setattr(plane.latency, "tick", lambda: [_Step()])
    monkeypatch.setattr(plane.latency, "weights", lambda: {"r": {"alpha": 90, "beta": 10}})
    assert plane.tick_weights()
    after = plane.cache.get_snapshot("a")
    assert before is not None and after is not None and plane.snapshot is not None
    assert after.version(ENDPOINT) == plane.snapshot.version(ENDPOINT) != before.version(ENDPOINT)
    assert after.version(LISTENER) == before.version(LISTENER)
    assert _native_paths(after) == [LIBRARY]


class _Step:
    def describe(self) -> str:
        return "alpha 50 -> 90"
