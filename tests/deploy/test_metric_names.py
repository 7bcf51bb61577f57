"""Every metric the alert rules and the dashboard name exists on `sluicegate up`'s
/metrics after traffic, with the labels they select and group by: the rules, the
dashboard and the code cannot drift apart.

A name exists when /metrics declares its family (its TYPE line) and the name is a series
of that family as Prometheus stores it (a counter `x` is `x_total`; a histogram `x` is
`x_bucket`, `x_sum` and `x_count`; a gauge is its name). A family may have no samples and
still exist: `sluicegate_xds_nacked_resources` has none while no Envoy NACKs. Labels are
checked on the series that have samples after the traffic of metrics_stack.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.artifacts import (
    LABEL_VALUES,
    manifest,
    promql,
    variable_query,
    variables,
)
from tests.deploy.exposition import Exposition
from tests.deploy.metrics_stack import metrics_stack_config, send_traffic
from tests.deploy.promql import SCRAPE_LABELS, label_uses, metric_names
from tests.e2e.stack import Stack, running_stack

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Scraped:
    stack: Stack
    exposition: Exposition


def _metrics(stack: Stack) -> str:
    url = "http://" + stack.doc["sluicegate"]["http"] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _wait_for(stack: Stack, done: Callable[[str], bool]) -> str:
    """/metrics once `done` holds (Envoy sends request records every 100 ms); bounded."""
    deadline = time.monotonic() + 20
    text = _metrics(stack)
    while not done(text) and time.monotonic() < deadline:
        time.sleep(0.2)
        text = _metrics(stack)
    return text


def _traffic_counted(text: str) -> bool:
    """The last requests' records are in: the retry, the stream and the shed."""
    return all(
        needle in text
        for needle in (
            "sluicegate_upstream_retries_total{",
            "gen_ai_server_time_to_first_token_seconds_count{",
            'error_code="queue_full"',
            'sluicegate_limiter_store_state_changes_total{state="down"}',
        )
    )


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    # A short path: the admin socket's must fit in 107 bytes.
    tmp = tmp_path_factory.mktemp("deploy")
    with running_stack(tmp, metrics_stack_config(tmp)) as stack:
        send_traffic(stack.gateway)
        yield Scraped(stack, Exposition.parse(_wait_for(stack, _traffic_counted)))


def test_every_metric_a_rule_or_panel_names_exists(scraped: Scraped) -> None:
    exposed = scraped.exposition.series
    named: dict[str, set[str]] = defaultdict(set)
    for where, expr in promql():
        for name in metric_names(expr):
            named[name].add(where)
    for variable in variables():
        if variable["type"] == "query":
            for name in metric_names(variable_query(variable)):
                named[name].add(f"variable {variable['name']}")
    assert named, "no metric names found in deploy/"
    missing = {name: sorted(where) for name, where in named.items() if name not in exposed}
    assert not missing, "named in deploy/ but not on /metrics:\n" + "\n".join(
        f"  {name}: {', '.join(where)}" for name, where in sorted(missing.items())
    )


def test_labels_selected_and_grouped_by_exist(scraped: Scraped) -> None:
    exposition = scraped.exposition
    wrong = []
    for where, expr in promql():
        for use in label_uses(expr):
            seen = set().union(*(exposition.labels.get(name, set()) for name in use.names))
            if not seen:  # no samples yet (or no such name: the test above says so)
                continue
            unknown = use.labels - seen - SCRAPE_LABELS
            if unknown:
                wrong.append(f"  {where}: {sorted(unknown)} not on {sorted(use.names)}")
    for variable in variables():
        if variable["type"] != "query":
            continue
        match = LABEL_VALUES.match(variable_query(variable))
        assert match, f"variable {variable['name']}: not label_values(metric, label)"
        metric, label = match.groups()
        if label not in exposition.labels.get(metric, set()):
            wrong.append(f"  variable {variable['name']}: {label} not on {metric}")
    assert not wrong, "labels not on the series they are used with:\n" + "\n".join(wrong)


def test_the_sidecar_envoy_probes_pass_against_a_running_envoy(scraped: Scraped) -> None:
    """40-example-app.yaml's exec probes, run against the stack's Envoy, whose admin is a
    Unix socket as in the manifests (only the socket's path differs)."""
    admin_path = scraped.stack.doc["sluicegate"]["envoy_admin"].removeprefix("unix:")
    pod = manifest("Deployment", "example-app")["spec"]["template"]["spec"]
    (envoy,) = [c for c in pod["initContainers"] if c["name"] == "envoy"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = list(envoy[probe]["exec"]["command"])
        assert command[:2] == ["python3", "-c"], command
        script = command[2].replace("/run/envoy/admin.sock", admin_path)
        assert admin_path in script, f"{probe} does not ask /run/envoy/admin.sock"
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=10)
        assert done.returncode == 0, (probe, done.stderr.decode())
    # And a probe fails where no Envoy answers.
    script = envoy["readinessProbe"]["exec"]["command"][2]
    nowhere = script.replace("/run/envoy/admin.sock", str(Path(admin_path).with_name("none.sock")))
    assert subprocess.run([sys.executable, "-c", nowhere], capture_output=True,
                          timeout=10).returncode != 0  # fmt: skip
