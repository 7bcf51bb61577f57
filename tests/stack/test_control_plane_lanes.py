"""The control plane steers `auto` tenants (docs/fast-lane.md, "The auto lane"): the lane
log's records move a tenant, the move is pushed as the key check's configuration alone,
and /status and its text form show it."""

from __future__ import annotations

import time
from pathlib import Path

from sluicegate.config import hash_key
from sluicegate.lanes import AutoLaneSettings, LaneSteering
from sluicegate.stack.control_plane import ControlPlane
from sluicegate.stack.status_http import status_document
from sluicegate.stack.status_text import render_status
from sluicegate.xds.resource import EXTENSION_CONFIG
from sluicegate.xds.server import SnapshotCache
from tests.lanes.test_records import batch, lane_record

KEY = "sk-sg-acme-ci-000000000000"
CONFIG = f"""
version: 1
listeners: [{{name: main, port: 8080}}]
providers:
  - {{name: alpha, base_url: "http://127.0.0.1:18081/v1"}}
routes:
  - {{name: r, models: [m], backends: [{{provider: alpha}}]}}
admission: {{lane: auto}}
tenants:
  - name: acme
    rate_limits: {{requests: 10, per: 1m}}
    keys: [{{name: ci, hash: "{hash_key(KEY)}", secret: {{file: ci.key}}}}]
"""


def test_records_past_half_a_limit_move_the_tenant_by_the_key_check_alone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sluicegate.yaml"
    path.write_text(CONFIG)
    (tmp_path / "ci.key").write_text(KEY)
    plane = ControlPlane(path, SnapshotCache(), lanes=LaneSteering(AutoLaneSettings()))
    assert plane.load().ok
    assert plane.tick_lanes() == []
    before = plane.snapshot
    assert before is not None

    # Four requests of ten: not yet; the fifth is half the limit.
    assert plane.on_records(batch(*(lane_record() for _ in range(4)))) == 4
    assert plane.tick_lanes() == []
    assert plane.on_records(batch(lane_record())) == 1
    [move] = plane.tick_lanes()
    assert (move.tenant, move.from_lane, move.to_lane) == ("acme", "fast", "exact")

    after = plane.snapshot
    assert after is not None and after is not before
    changed = [t for t in after.type_urls() if after.version(t) != before.version(t)]
    assert changed == [EXTENSION_CONFIG]
    assert plane.model is not None and plane.model.tenants[0].lane == "exact"

    document = status_document(plane)
    lanes = document["lanes"]["acme"]
    assert (lanes["lane"], lanes["moves"]) == ("exact", 1)
    assert lanes["limits"] == [
        {"key": None, "kind": "requests", "limit": 10, "window_s": 60.0, "used": 5}
    ]
    text = render_status(document, time.time())
    assert "Auto lane" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("acme"))
    assert row.split()[:2] == ["acme", "exact"] and "tenant requests 5/10 per 60s" in row
    assert KEY not in text

    # A reload keeps the lane and what was counted.
    path.write_text(CONFIG.replace("requests: 10", "requests: 12"))
    assert plane.load().ok
    assert plane.model is not None and plane.model.tenants[0].lane == "exact"


def test_a_rejected_reload_keeps_the_lanes_and_counts(tmp_path: Path) -> None:
    """docs/xds-rules.md rule 14: a config naming a resource it lacks is not published;
    the lane steering keeps the last good config's tenants, lanes and counts too."""
    path = tmp_path / "sluicegate.yaml"
    path.write_text(CONFIG)
    (tmp_path / "ci.key").write_text(KEY)
    plane = ControlPlane(path, SnapshotCache())
    assert plane.load().ok
    plane.on_records(batch(*(lane_record() for _ in range(5))))
    assert [m.to_lane for m in plane.tick_lanes()] == ["exact"]
    # A reload that drops the tenant, then is refused at publish.
    plane.cache.missing_references = lambda snapshot: ["a resource"]  # type: ignore[method-assign]
    path.write_text(CONFIG.replace("lane: auto", "lane: exact"))
    assert not plane.load().ok
    lanes = status_document(plane)["lanes"]
    assert lanes["acme"]["lane"] == "exact" and lanes["acme"]["limits"][0]["used"] == 5

