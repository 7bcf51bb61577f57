"""deploy/grafana/sluicegate-dashboard.json: a Grafana dashboard (schemaVersion 39) whose
panels each have a query that is valid PromQL (promtool parses it), whose variables
all exist, and whose layout fits Grafana's 24-column grid without overlaps."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.artifacts import (
    LABEL_VALUES,
    dashboard,
    promtool,
    query_panels,
    variable_query,
    variables,
)

# Grafana's own variables a query may use.
GLOBALS = {"__all", "__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
FILTERS = {"provider", "route", "tenant", "scenario"}


def _used_variables(value: Any) -> set[str]:
    text = value if isinstance(value, str) else repr(value)
    return {braced or bare for braced, bare in VARIABLE.findall(text)}


def test_the_dashboard_has_grafanas_shape() -> None:
    board = dashboard()
    for key in ("uid", "title", "panels", "templating", "schemaVersion", "time"):
        assert key in board, key
    assert board["schemaVersion"] >= 36  # datasource references by uid
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in board["panels"]:
        assert {"type", "title", "gridPos"} <= panel.keys(), panel.get("title")
    panels = query_panels()
    assert len(panels) >= 20
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), f"panel {panel['title']!r}: empty query"
            assert target["datasource"] == panel["datasource"]


def test_panels_fit_the_grid_without_overlapping() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = panel["title"]


def test_variables_resolve() -> None:
    defined = {variable["name"]: variable for variable in variables()}
    assert defined["datasource"]["type"] == "datasource"
    assert defined["datasource"]["query"] == "prometheus"
    assert defined.keys() >= FILTERS
    for name in FILTERS:
        assert LABEL_VALUES.match(variable_query(defined[name])), name
        assert defined[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    used = _used_variables(dashboard()["panels"]) | _used_variables(variables())
    unknown = used - defined.keys() - GLOBALS
    assert not unknown, f"variables used but not defined: {sorted(unknown)}"
    # Every filter narrows at least one panel.
    assert used >= FILTERS


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule, its variables filled in as
    Grafana would (a regex matching everything, a rate interval)."""

    def filled(expr: str) -> str:
        expr = expr.replace("$__rate_interval", "1m").replace("${datasource}", "")
        return VARIABLE.sub(".*", expr)

    rules = [
        {"record": f"dashboard:panel_{p['id']}:{t['refId']}", "expr": filled(t["expr"])}
        for p in query_panels()
        for t in p["targets"]
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
