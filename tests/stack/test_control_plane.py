"""The control plane publishes one resolved model to Envoy and the filter, or nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluicegate.model import Gateway
from sluicegate.stack import control_plane as control_plane_module
from sluicegate.stack.control_plane import ControlPlane
from sluicegate.xds.server import ENDPOINT, SnapshotCache

CONFIG = """
version: 1
listeners: [{name: main, port: 8080}]
providers:
  - {name: alpha, base_url: "http://127.0.0.1:18081/v1"}
routes:
  - {name: r, models: [MODEL], backends: [{provider: alpha}]}
"""


def plane_for(tmp_path: Path, seen: list[Gateway]) -> ControlPlane:
    path = tmp_path / "sluicegate.yaml"
    path.write_text(CONFIG.replace("MODEL", "m1"))
    plane = ControlPlane(path, SnapshotCache(), on_model=seen.append)
    assert plane.load().ok
    return plane


def test_the_filter_and_envoy_get_the_same_model(tmp_path: Path) -> None:
    seen: list[Gateway] = []
    plane = plane_for(tmp_path, seen)
    assert seen == [plane.model]
    assert plane.model is not None and list(plane.model.served) == ["m1"]


def test_an_inconsistent_snapshot_is_not_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A translation that loses a resource another names (here: the endpoints of an EDS
    cluster) must reach neither Envoy nor the filter; the last good config serves on."""
    seen: list[Gateway] = []
    plane = plane_for(tmp_path, seen)
    good_snapshot, good_model = plane.snapshot, plane.model
    assert plane.cache.get_snapshot() is good_snapshot

    real_translate = control_plane_module.translate

    def losing_endpoints(gateway: Gateway, memo: Any = None) -> dict[str, list[Any]]:
        resources = real_translate(gateway, memo)
        resources[ENDPOINT] = []
        return resources

    monkeypatch.setattr(control_plane_module, "translate", losing_endpoints)
    plane.path.write_text(CONFIG.replace("MODEL", "m2"))
    outcome = plane.load()

    assert not outcome.ok
    assert any("inconsistent snapshot" in p and "route-r" in p for p in outcome.problems)
    assert plane.cache.get_snapshot() is good_snapshot
    assert plane.snapshot is good_snapshot and plane.model is good_model
    assert seen == [good_model]  # the filter never saw the m2 model
    assert "last good config keeps serving" in caplog.text


def test_a_rejected_reload_gives_its_errors_as_reasons_and_its_warnings_apart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plane = plane_for(tmp_path, [])
    # An error (unknown provider) and a warning (a provider no route uses).
    broken = CONFIG.replace("MODEL", "m1").replace(
        '  - {name: alpha, base_url: "http://127.0.0.1:18081/v1"}',
        '  - {name: alpha, base_url: "http://127.0.0.1:18081/v1"}\n'
        '  - {name: spare, base_url: "http://127.0.0.1:18082/v1"}',
    ).replace("{provider: alpha}", "{provider: nope}")
    plane.path.write_text(broken)
    caplog.clear()
    outcome = plane.load()
    assert not outcome.ok
    assert len(outcome.problems) == 1 and "unknown provider 'nope'" in outcome.problems[0]
    rejected = [r.getMessage() for r in caplog.records if "config rejected" in r.getMessage()]
    assert len(rejected) == 1 and "unknown provider" in rejected[0]
    warned = [r for r in caplog.records if "no route sends traffic to provider" in r.getMessage()]
    assert warned and {r.levelname for r in warned} == {"WARNING"}


def test_live_drains_outlive_the_control_plane_through_its_drained_file(tmp_path: Path) -> None:
    """A restarted control plane publishes the snapshot its predecessor had (same
    versions), drains included, so a reconnecting Envoy is sent nothing again."""
    path = tmp_path / "sluicegate.yaml"
    path.write_text(CONFIG.replace("MODEL", "m1").replace(
        '  - {name: alpha, base_url: "http://127.0.0.1:18081/v1"}',
        '  - {name: alpha, base_url: "http://127.0.0.1:18081/v1"}\n'
        '  - {name: beta, base_url: "http://127.0.0.1:18082/v1"}',
    ).replace("[{provider: alpha}]", "[{provider: alpha}, {provider: beta}]"))  # fmt: skip
    drained = tmp_path / "drained.json"
    first = ControlPlane(path, SnapshotCache(), drained_file=drained)
    assert first.load().ok
    assert first.set_drained("beta", drained=True).ok
    again = ControlPlane(path, SnapshotCache(), drained_file=drained)
    assert again.load().ok
    assert again.drained == {"beta"}
    assert first.snapshot is not None and again.snapshot is not None
    assert again.snapshot.versions() == first.snapshot.versions()
    assert again.set_drained("beta", drained=False).ok
    assert ControlPlane(path, SnapshotCache(), drained_file=drained).drained == set()


def test_the_native_library_it_is_told_goes_into_the_model_and_the_status(tmp_path: Path) -> None:
    """`native_filters.module` as a path: the model (so the translator) names it, and
    `/status` says which library Envoy was told and why; `off` again takes it back."""
    from sluicegate.stack.status_http import status_document

    path = tmp_path / "sluicegate.yaml"
    library = "/opt/sluicegate/libsluicegate_native.so"
    path.write_text(CONFIG.replace("MODEL", "m1") + f"native_filters: {{module: {library}}}\n")
    plane = ControlPlane(path, SnapshotCache())
    assert plane.load().ok
    assert plane.model is not None and plane.model.native_module == library
    assert status_document(plane)["native_filters"]["path"] == library
    path.write_text(CONFIG.replace("MODEL", "m1"))
    assert plane.load().ok
    assert plane.model.native_module is None
    assert status_document(plane)["native_filters"]["path"] is None


def test_a_failed_native_build_is_resolved_once_per_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`auto` without gcc: Envoy's own filters, and the build is not tried again on every
    reload (it runs on the control plane's event loop); a changed setting is resolved."""
    calls: list[str] = []
    real = control_plane_module.resolve_module

    def counted(setting: str) -> Any:
        calls.append(setting)
        return real(setting)

    monkeypatch.setattr(control_plane_module, "resolve_module", counted)
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc
    path = tmp_path / "sluicegate.yaml"
    path.write_text(CONFIG.replace("MODEL", "m1") + "native_filters: {module: auto}\n")
    plane = ControlPlane(path, SnapshotCache())
    assert plane.load().ok and plane.load().ok
    assert plane.model is not None and plane.model.native_module is None
    assert calls == ["auto"]
    path.write_text(CONFIG.replace("MODEL", "m2") + "native_filters: {module: /x/lib.so}\n")
    assert plane.load().ok
    assert calls == ["auto", "/x/lib.so"]
    assert plane.model.native_module == "/x/lib.so"
