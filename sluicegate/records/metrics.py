"""Prometheus metrics from request records (docs/metrics.md, "Metrics").

Latency metrics take the names of OpenTelemetry's GenAI semantic conventions
(gen_ai.server.request.duration, gen_ai.server.time_to_first_token,
gen_ai.server.time_per_output_token, gen_ai.client.token.usage) with Prometheus units;
their buckets start at the conventions' advice and reach further, since an LLM answer
can take minutes. Labels are bounded (labels.py). Everything is updated once per record,
from the batch Envoy sends, never per chunk.
"""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram

from .labels import LABELS
from .record import RequestRecord

# gen_ai.server.request.duration's advice (0.01 … 81.92 s, doubling), then to 11 minutes:
# routes' total timeout is 10 minutes by default.
DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    163.84, 327.68, 655.36,
)  # fmt: skip
# gen_ai.server.time_to_first_token's advice (1 ms … 10 s), then to 2 minutes: a long
# prompt or a reasoning model's first token.
TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 15.0, 30.0, 60.0, 120.0,
)  # fmt: skip
# gen_ai.server.time_per_output_token's advice (10 ms … 2.5 s), from 1 ms: small models
# decode a token in a few milliseconds.
TPOT_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5,
)  # fmt: skip
# A gate's wait: nothing to a priority class's max_wait (admission's queue buckets).
QUEUE_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def time_per_output_token(record: RequestRecord) -> float | None:
    """(duration - TTFT) / (output tokens - 1) of a successful stream with at least two
    output tokens (its usage's, else its events counted: output_tokens_or_events): the
    decode time per token after the first; otherwise None."""
    tokens = record.output_tokens_or_events
    if not record.stream or record.status_class != "2xx" or tokens is None or tokens < 2:
        return None
    if record.duration_s is None or record.ttft_s is None:
        return None
    decode_s = record.duration_s - record.ttft_s
    return decode_s / (tokens - 1) if decode_s >= 0 else None


class RecordMetrics:
    """The record-fed metrics, on `registry` (the one the ext_proc server's /metrics serves)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._series: dict[tuple[str, ...], _Series] = {}
        self.duration = Histogram(
            "gen_ai_server_request_duration_seconds",
            "Request duration: first byte received to last byte sent to the client",
            [*LABELS, "status_class"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Successful streams: request start to the provider's first body byte",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.provider_ttft = Histogram(
            "sluicegate_provider_time_to_first_token_seconds",
            "Successful streams: the answering attempt sent to the provider's first body "
            "byte (the provider's own TTFT, without the gateway's routing, queue and "
            "earlier attempts)",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Successful streams with usage: (duration - TTFT) / (output tokens - 1)",
            LABELS,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "gen_ai_client_token_usage",
            "Tokens the providers reported, by type (input, output)",
            [*LABELS, "token_type"],
            registry=r,
        )
        self.requests = Counter(
            "sluicegate_requests",
            "Requests by status class and error code (admitted or refused)",
            [*LABELS, "status_class", "error_code"],
            registry=r,
        )
        self.attempts = Counter(
            "sluicegate_upstream_attempts",
            "Attempts sent to providers (the provider label: the one that answered last)",
            LABELS,
            registry=r,
        )
        self.retries = Counter(
            "sluicegate_upstream_retries",
            "Attempts after a request's first",
            LABELS,
            registry=r,
        )
        self.queue = Histogram(
            "sluicegate_request_queue_time_seconds",
            "Time a request waited at a priority gate (0 when it did not wait)",
            LABELS,
            buckets=QUEUE_BUCKETS,
            registry=r,
        )

    def observe(self, record: RequestRecord, labels: tuple[str, ...]) -> None:
        """Count one record under its (bounded) label values, in LABELS order."""
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = _Series(self, labels)
        klass = record.status_class
        series.counter("requests", klass, record.error_code).inc()
        if record.duration_s is not None:
            series.histogram("duration", klass).observe(record.duration_s)
        if record.stream and klass == "2xx":
            if record.ttft_s is not None:
                series.histogram("ttft").observe(record.ttft_s)
            if record.provider_ttft_s is not None:
                series.histogram("provider_ttft").observe(record.provider_ttft_s)
        tpot = time_per_output_token(record)
        if tpot is not None:
            series.histogram("tpot").observe(tpot)
        if record.input_tokens:
            series.counter("tokens", "input").inc(record.input_tokens)
        if output := record.output_tokens_or_events:
            series.counter("tokens", "output").inc(output)
        if record.attempts:
            series.counter("attempts").inc(record.attempts)
            if record.attempts > 1:
                series.counter("retries").inc(record.attempts - 1)
        if record.queue_s is not None:
            series.histogram("queue").observe(record.queue_s)


class _Series:
    """The children of the metrics for one label set, each looked up once (`labels()`
    takes a lock and checks its arguments on every call: most of a record's cost) and
    only when first used, so /metrics shows no series that never counted anything."""

    __slots__ = ("_children", "_labels", "_metrics")

    def __init__(self, metrics: RecordMetrics, labels: tuple[str, ...]) -> None:
        self._metrics = metrics
        self._labels = labels
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, key: tuple[str, ...]) -> Any:
        child = self._children.get(key)
        if child is None:
            metric = getattr(self._metrics, key[0])
            child = self._children[key] = metric.labels(*self._labels, *key[1:])
        return child

    def counter(self, name: str, *extra: str) -> Counter:
        child: Counter = self._child((name, *extra))
        return child

    def histogram(self, name: str, *extra: str) -> Histogram:
        child: Histogram = self._child((name, *extra))
        return child
