"""The helpers the drift test reads deploy/'s PromQL and /metrics with (test_metric_names.py)
find what they must, so a drift cannot pass unseen."""

from __future__ import annotations

from tests.deploy.exposition import Exposition
from tests.deploy.promql import label_uses, metric_names

EXPR = """
histogram_quantile(0.95,
  sum by (le, route, scenario) (rate(gen_ai_server_time_to_first_token_seconds_bucket[5m])))
  > 2  # OBJECTIVE: not sluicegate_in_a_comment
and on (route)
sum without (state) (sluicegate_store_changes_total{state="down", op=~"a#b"})
"""


def test_metric_names_skip_comments() -> None:
    assert metric_names(EXPR) == {
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "sluicegate_store_changes_total",
    }


def test_label_uses_are_selectors_and_groupings() -> None:
    uses = {(tuple(sorted(u.names)), tuple(sorted(u.labels))) for u in label_uses(EXPR)}
    assert uses == {
        (("sluicegate_store_changes_total",), ("op", "state")),
        (("gen_ai_server_time_to_first_token_seconds_bucket",), ("le", "route", "scenario")),
        (("sluicegate_store_changes_total",), ("state",)),
    }


EXPOSITION = """\
# HELP sluicegate_requests_total Requests
# TYPE sluicegate_requests_total counter
sluicegate_requests_total{route="a",status_class="2xx"} 1.0
# HELP sluicegate_wait_seconds Wait
# TYPE sluicegate_wait_seconds histogram
# HELP sluicegate_nacks NACKs
# TYPE sluicegate_nacks gauge
"""


def test_exposition_names_series_as_prometheus_stores_them() -> None:
    found = Exposition.parse(EXPOSITION)
    assert found.series == {
        "sluicegate_requests_total",
        "sluicegate_wait_seconds_bucket",
        "sluicegate_wait_seconds_sum",
        "sluicegate_wait_seconds_count",
        "sluicegate_nacks",
    }
    # Not the names PromQL never sees: a counter without _total, a histogram's base.
    assert "sluicegate_requests" not in found.series
    assert "sluicegate_wait_seconds" not in found.series
    assert found.labels["sluicegate_requests_total"] == {"route", "status_class"}
    assert "sluicegate_nacks" not in found.labels
