"""With replicas, up's /metrics shows every ext_proc server's samples, each labelled by its
server (stack/ext_proc_metrics.py): never a sum, whose counters would drop whenever a
replica restarts or misses a scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.stack.ext_proc_metrics import MAIN_SERVER, SERVER_LABEL, labelled_exposition


def _server(requests: int, latency: float, in_flight: int) -> bytes:
    registry = CollectorRegistry()
    Counter("demo_requests", "requests", ["route"], registry=registry).labels("chat").inc(requests)
    histogram = Histogram("demo_seconds", "latency", buckets=(0.1, 1.0), registry=registry)
    histogram.observe(latency)
    Gauge("demo_in_flight", "in flight", registry=registry).set(in_flight)
    return generate_latest(registry)


def _values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_every_sample_is_kept_and_labelled_by_its_server() -> None:
    replica = "127.0.0.1:50052"
    text = labelled_exposition([(MAIN_SERVER, _server(3, 0.05, 2)), (replica, _server(4, 0.5, 1))])
    values = _values(text)
    assert values[("demo_requests_total", (("ext_proc", "main"), ("route", "chat")))] == 3
    assert values[("demo_requests_total", (("ext_proc", replica), ("route", "chat")))] == 4
    assert values[("demo_seconds_bucket", (("ext_proc", replica), ("le", "0.1")))] == 0
    assert values[("demo_seconds_count", (("ext_proc", "main"),))] == 1
    assert values[("demo_in_flight", (("ext_proc", replica),))] == 1
    # One family each, as Prometheus wants them: every sample labelled.
    families = [f.name for f in text_string_to_metric_families(text.decode())]
    assert len(families) == len(set(families))
    for family in text_string_to_metric_families(text.decode()):
        assert all(SERVER_LABEL in sample.labels for sample in family.samples)


def test_a_server_answering_garbage_is_left_out() -> None:
    text = labelled_exposition([(MAIN_SERVER, _server(3, 0.05, 2)), ("x", b"\xff not {")])
    values = _values(text)
    assert values[("demo_requests_total", (("ext_proc", "main"), ("route", "chat")))] == 3
    assert not any(dict(labels).get("ext_proc") == "x" for _, labels in values)
