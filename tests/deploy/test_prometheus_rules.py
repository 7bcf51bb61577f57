"""deploy/prometheus: the alert rules pass `promtool check rules` and their unit tests
(`promtool test rules`), the example config passes `promtool check config`, and every
alert carries what an operator needs: a `for:`, a severity, a summary and a description
naming its runbook section in docs/operations.md, which exists."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.deploy.artifacts import (
    OPERATIONS,
    PROMETHEUS_EXAMPLE,
    RULES,
    RULES_TEST,
    alert_rules,
    promtool,
)

SEVERITIES = {"critical", "warning"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args",
    [
        ("check", "rules", RULES.name),
        ("test", "rules", RULES_TEST.name),
        ("check", "config", PROMETHEUS_EXAMPLE.name),
    ],
    ids=" ".join,
)
def test_promtool_accepts(args: tuple[str, ...]) -> None:
    done = _promtool(*args)
    assert done.returncode == 0, done.stdout + done.stderr


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_alert_has_for_severity_and_a_runbook_that_exists() -> None:
    operations = OPERATIONS.read_text()
    anchors = _anchors(operations)
    rules = alert_rules()
    assert len(rules) >= 10
    for rule in rules:
        name = rule["alert"]
        assert "for" in rule, name
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        page, _, anchor = annotations["runbook"].partition("#")
        assert page == "docs/operations.md", name
        assert anchor in anchors, f"{name}: no section #{anchor} in docs/operations.md"
        assert annotations["runbook"] in annotations["description"], name
        assert name in operations, f"{name} is not described in docs/operations.md"


def test_the_unit_tests_cover_alerts_of_every_group() -> None:
    """A few alerts of each kind are tested; the test file names them by alertname."""
    tested = set(re.findall(r"alertname:\s*(\w+)", RULES_TEST.read_text()))
    assert tested <= {rule["alert"] for rule in alert_rules()}
    for needed in (
        "SluicegateTTFTP95High",
        "SluicegateErrorRateHigh",
        "SluicegateShedRateHigh",
        "SluicegateProviderEjected",
        "SluicegateProviderWeightedDown",
        "SluicegateEnvoyNack",
        "SluicegateProcessDown",
        "SluicegateLimiterStoreDown",
    ):
        assert needed in tested
