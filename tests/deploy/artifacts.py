"""The files under deploy/, loaded, and the PromQL each of them holds."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

DEPLOY: Final = Path(__file__).resolve().parents[2] / "deploy"
RULES: Final = DEPLOY / "prometheus" / "sluicegate-alerts.yaml"
RULES_TEST: Final = DEPLOY / "prometheus" / "sluicegate-alerts.test.yaml"
PROMETHEUS_EXAMPLE: Final = DEPLOY / "prometheus" / "prometheus.example.yml"
DASHBOARD: Final = DEPLOY / "grafana" / "sluicegate-dashboard.json"
KUBERNETES: Final = DEPLOY / "kubernetes"
OPERATIONS: Final = Path(__file__).resolve().parents[2] / "docs" / "operations.md"

# A query's `label_values(metric, label)` (Grafana's Prometheus variable query).
LABEL_VALUES: Final = re.compile(r"^label_values\(\s*([a-zA-Z_:]\w*)\s*,\s*(\w+)\s*\)$")


def promtool() -> str:
    """promtool's path; the tests never skip for want of it."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: run `make promtool` (Debian's prometheus package)")
    return found


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return result


def query_panels() -> list[dict[str, Any]]:
    """Every panel but the rows (which only group the others)."""
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def variables() -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = dashboard()["templating"]["list"]
    return result


def variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def promql() -> list[tuple[str, str]]:
    """(where, expression) for every alert rule and every panel's query."""
    found = [(f"alert {rule['alert']}", str(rule["expr"])) for rule in alert_rules()]
    for panel in query_panels():
        found += [(f"panel {panel['title']!r}", str(t["expr"])) for t in panel["targets"]]
    return found


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    """(file, object) for every Kubernetes object under deploy/kubernetes."""
    return [
        (path, document)
        for path in sorted(KUBERNETES.glob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document is not None
    ]


def manifest(kind: str, name: str) -> dict[str, Any]:
    (found,) = [m for _, m in manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    return found
