"""The record metrics: names, labels, the TPOT rule, buckets."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sluicegate import wire
from sluicegate.records import (
    DURATION_BUCKETS,
    QUEUE_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    Declared,
    RecordSink,
    decode,
    time_per_output_token,
)
from sluicegate.testing import metadata_fields

from .helpers import STREAMED_META, export_of, gateway, log_record, streamed

MAPS = Declared.from_gateway(gateway()).model_maps
LABELS = {"route": "chat", "provider": "alpha", "model": "m", "tenant": "acme",
          "priority": "interactive", "scenario": "default"}  # fmt: skip


def _sink() -> tuple[RecordSink, CollectorRegistry]:
    registry = CollectorRegistry()
    sink = RecordSink(registry)
    sink.load(gateway())
    return sink, registry


def test_tpot_is_decode_time_per_token_after_the_first() -> None:
    record = decode(log_record(streamed()), MAPS)  # TTFT 0.3 s, end 0.68 s, 20 tokens
    assert time_per_output_token(record) == pytest.approx(0.38 / 19)


@pytest.mark.parametrize(
    "change",
    [
        {"output_tokens": 1},
        {"output_tokens": 0},
        {"output_tokens": None},
        {"stream": False},
        {"status_class": "5xx"},
        {"ttft_s": None},
        {"duration_s": None},
        {"ttft_s": 0.9},  # after the last byte: clocks disagree, no negative TPOT
    ],
)
def test_no_tpot_without_a_successful_stream_of_two_tokens(change: dict[str, object]) -> None:
    record = dataclasses.replace(decode(log_record(streamed()), MAPS), **change)  # type: ignore[arg-type]
    assert time_per_output_token(record) is None


def test_a_stream_without_usage_is_timed_by_its_counted_events() -> None:
    """No usage (a provider that sends none, a stream cut short): the events Envoy
    counted stand for its output tokens; with usage, the usage counts."""
    record = decode(log_record(streamed()), MAPS)
    counted = dataclasses.replace(record, output_tokens=None, content_events=11)
    assert counted.output_tokens_or_events == 11
    assert time_per_output_token(counted) == pytest.approx(0.38 / 10)
    assert dataclasses.replace(record, content_events=11).output_tokens_or_events == 20
    assert dataclasses.replace(counted, stream=False).output_tokens_or_events is None
    assert dataclasses.replace(counted, content_events=None).output_tokens_or_events is None


def test_buckets_reach_from_milliseconds_to_minutes() -> None:
    for buckets in (DURATION_BUCKETS, TTFT_BUCKETS, TPOT_BUCKETS, QUEUE_BUCKETS):
        assert list(buckets) == sorted(set(buckets))
    assert DURATION_BUCKETS[0] <= 0.01 and DURATION_BUCKETS[-1] >= 600  # a 10 min total timeout
    assert TTFT_BUCKETS[0] <= 0.001 and TTFT_BUCKETS[-1] >= 60
    assert TPOT_BUCKETS[0] <= 0.001 and TPOT_BUCKETS[-1] >= 1
    # OpenTelemetry's advised boundaries are all there (gen-ai-metrics.md).
    assert {0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
            40.96, 81.92} <= set(DURATION_BUCKETS)  # fmt: skip
    assert {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
            5.0, 7.5, 10.0} <= set(TTFT_BUCKETS)  # fmt: skip
    assert {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5} <= set(
        TPOT_BUCKETS
    )


def test_a_batch_counts_every_metric_once_per_record() -> None:
    sink, registry = _sink()
    retried = streamed(**{wire.RECORD_ATTEMPTS: "3"})
    refused = {wire.RECORD_STATUS: "401", wire.RECORD_DETAILS: "sluicegate_invalid_api_key",
               wire.RECORD_LAST_DOWNSTREAM_BYTE_US: "3000"}  # fmt: skip
    assert sink.on_export(export_of(log_record(streamed()), log_record(retried),
                                    log_record(refused))) == 3  # fmt: skip
    sample = registry.get_sample_value
    ok = {**LABELS, "status_class": "2xx"}
    assert sample("gen_ai_server_request_duration_seconds_count", ok) == 2
    assert sample("gen_ai_server_request_duration_seconds_sum", ok) == pytest.approx(1.36)
    assert sample("gen_ai_server_time_to_first_token_seconds_count", LABELS) == 2
    assert sample("gen_ai_server_time_to_first_token_seconds_bucket", {**LABELS, "le": "0.25"}) == 0
    assert sample("gen_ai_server_time_to_first_token_seconds_bucket", {**LABELS, "le": "0.5"}) == 2
    # The provider's own TTFT, beside the one the client waited.
    provider_ttft = "sluicegate_provider_time_to_first_token_seconds"
    assert sample(f"{provider_ttft}_count", LABELS) == 2
    assert sample(f"{provider_ttft}_sum", LABELS) == pytest.approx(0.59)
    assert sample("gen_ai_server_time_per_output_token_seconds_count", LABELS) == 2
    assert sample("gen_ai_client_token_usage_total", {**LABELS, "token_type": "input"}) == 14
    assert sample("gen_ai_client_token_usage_total", {**LABELS, "token_type": "output"}) == 40
    assert sample("sluicegate_upstream_attempts_total", LABELS) == 4
    assert sample("sluicegate_upstream_retries_total", LABELS) == 2
    assert sample("sluicegate_request_queue_time_seconds_count", LABELS) == 2
    assert sample("sluicegate_requests_total", {**ok, "error_code": ""}) == 2
    # A 401 names no tenant but is the anonymous one's (records.decode).
    nothing = {**dict.fromkeys(LABELS, "none"), "tenant": wire.ANONYMOUS_TENANT}
    assert (
        sample(
            "sluicegate_requests_total",
            {**nothing, "status_class": "4xx", "error_code": "invalid_api_key"},
        )
        == 1
    )
    assert sample("gen_ai_server_request_duration_seconds_count",
                  {**nothing, "status_class": "4xx"}) == 1  # fmt: skip


def test_reload_relabels_later_records() -> None:
    sink, registry = _sink()
    sink.on_export(export_of(log_record(streamed())))
    renamed = gateway()
    renamed = dataclasses.replace(
        renamed, routes=tuple(dataclasses.replace(r, name="talk") for r in renamed.routes)
    )
    sink.load(renamed)
    sink.on_export(export_of(log_record(streamed())))  # Envoy still says route "chat"
    duration = "gen_ai_server_request_duration_seconds_count"
    assert registry.get_sample_value(duration, {**LABELS, "status_class": "2xx"}) == 1
    assert (
        registry.get_sample_value(duration, {**LABELS, "route": "other", "status_class": "2xx"})
        == 1
    )


def test_no_key_in_the_exposition() -> None:
    sink, registry = _sink()
    meta = {**STREAMED_META, wire.META_KEY_NAME: "key-name-secretish"}
    sink.on_export(export_of(log_record(streamed(**metadata_fields(meta)))))
    text = generate_latest(registry).decode()
    assert "key-name-secretish" not in text
    assert "gen_ai_server_request_duration_seconds_bucket" in text
