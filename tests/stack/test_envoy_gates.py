"""How full Envoy holds the gates it enforces (stack/envoy_gates.py): Envoy's stats read
into `/status` `envoy_gates`, its gauges, and `sluicegate status`'s table. Through a real
Envoy: tests/e2e/test_fast_lane_gate.py."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sluicegate.stack.envoy_gates import gates_document, gates_metrics, read_stats
from sluicegate.stack.status_text import render_status

SPLIT = {"requests": 3, "pending": 5, "top_class": "interactive", "top_requests": 1,
         "top_pending": 2}  # fmt: skip
WHOLE = {"requests": 8, "pending": 12, "top_class": None, "top_requests": 0, "top_pending": 0}


def stat(name: str, value: Any) -> dict[str, Any]:
    return {"name": name, "value": value}


STATS = {
    "stats": [
        # A route's name may hold dots.
        stat("cluster.route-chat.v2.circuit_breakers.default.remaining_rq", 1),
        stat("cluster.route-chat.v2.circuit_breakers.default.remaining_pending", 5),
        stat("cluster.route-chat.v2.circuit_breakers.high.remaining_rq", 0),
        stat("cluster.route-chat.v2.circuit_breakers.high.remaining_pending", 1),
        stat("cluster.route-chat.v2.upstream_rq_pending_overflow", 4),
        stat("cluster.route-chat.v2.upstream_rq_overflow", 1),
        stat("cluster.route-bulk.circuit_breakers.default.remaining_rq", 8),
        stat("cluster.ext_proc.circuit_breakers.default.remaining_rq", 3),  # not a route's
        stat("cluster.route-bulk.circuit_breakers.default.remaining_pending", "x"),  # malformed
        {"histograms": {}},
    ]
}


def test_each_partition_is_its_limit_less_what_envoy_says_remains() -> None:
    document = gates_document({"chat.v2": SPLIT, "bulk": WHOLE}, read_stats(STATS))
    assert document == {
        "bulk": {
            "partitions": [
                {"partition": "all", "class": None, "priority": "default", "in_flight": 0,
                 "max_requests": 8, "waiting": None, "max_pending": 12},
            ],
            "refused": None,
        },
        "chat.v2": {
            "partitions": [
                {"partition": "top", "class": "interactive", "priority": "high",
                 "in_flight": 1, "max_requests": 1, "waiting": 1, "max_pending": 2},
                {"partition": "rest", "class": None, "priority": "default", "in_flight": 2,
                 "max_requests": 3, "waiting": 0, "max_pending": 5},
            ],
            "refused": 5,
        },
    }  # fmt: skip


def test_without_envoys_answer_only_the_limits_are_known() -> None:
    (partition,) = gates_document({"bulk": WHOLE}, None)["bulk"]["partitions"]
    assert (partition["in_flight"], partition["max_requests"]) == (None, 8)
    assert gates_document({"bulk": WHOLE}, None)["bulk"]["refused"] is None
    # No gauge sample for what is not known; the limits still show.
    samples = _samples(gates_metrics(gates_document({"bulk": WHOLE}, None)))
    assert samples == {
        ("sluicegate_envoy_gate_max_in_flight_requests", ("bulk", "all")): 8,
        ("sluicegate_envoy_gate_max_waiting_requests", ("bulk", "all")): 12,
    }


def test_the_gauges_name_route_and_partition() -> None:
    samples = _samples(gates_metrics(gates_document({"chat.v2": SPLIT}, read_stats(STATS))))
    assert samples[("sluicegate_envoy_gate_in_flight_requests", ("chat.v2", "rest"))] == 2
    assert samples[("sluicegate_envoy_gate_waiting_requests", ("chat.v2", "top"))] == 1
    assert samples[("sluicegate_envoy_gate_refused_requests_total", ("chat.v2",))] == 5
    assert gates_metrics({}) == b""


def test_status_shows_a_table_of_partitions() -> None:
    document = {"envoy_gates": gates_document({"chat.v2": SPLIT}, read_stats(STATS))}
    text = render_status(document, 0.0)
    section = text[text.index("Envoy's gates") :].splitlines()
    assert section[2].split() == ["ROUTE", "PARTITION", "IN", "FLIGHT", "WAITING", "REFUSED"]
    assert section[3].split() == ["chat.v2", "top", "(interactive)", "1/1", "1/2", "5"]
    assert section[4].split() == ["rest", "2/3", "0/5"]
    assert "Envoy's gates" not in render_status({"envoy_gates": {}}, 0.0)


def _samples(text: bytes) -> dict[tuple[str, tuple[str, ...]], float]:
    return {
        (
            sample.name,
            tuple(sample.labels[k] for k in ("route", "partition") if k in sample.labels),
        ): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if not sample.name.endswith("_created")
    }
