"""Envoy accepts everything sluicegate pushes without a deprecation warning, but one.

Deprecated fields still work today but are removed in later Envoy releases (or fail
under --reject-deprecated), so a push that uses one is a bug waiting for an upgrade.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import running_stack

pytestmark = pytest.mark.e2e

OTEL_COMMON_CONFIG = "OpenTelemetryAccessLogConfig.common_config"


def test_the_quickstart_pushes_no_deprecated_field(tmp_path: Path) -> None:
    # The quickstart has outlier detection (429 ejection), health checks, retries, timeouts,
    # a concurrency gate, admission with tenants and keys; a fault drill is added.
    doc = quickstart_on_free_ports(tmp_path)
    route = next(r for r in doc["routes"] if r["name"] == "qwen")
    route["fault"] = {"delay": {"percent": 1, "duration": "10ms"}}
    with running_stack(tmp_path, doc) as stack:
        clusters = stack.admin_json("/config_dump?resource=dynamic_active_clusters")
        assert clusters["configs"], "Envoy got no clusters"
        time.sleep(0.5)  # let Envoy log anything about the pushed resources
        log = (tmp_path / "work" / "envoy.log").read_text(errors="replace")
    # The one allowed: the OpenTelemetry loggers' common_config, the only place Envoy 1.40
    # reads their flush interval from (xds/translate/record_log.py).
    deprecated = [line for line in log.splitlines() if "Deprecated field" in line]
    assert all(OTEL_COMMON_CONFIG in line for line in deprecated), deprecated
