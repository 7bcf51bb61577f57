"""What a record says of its provider, and the time-decayed means it feeds
(docs/latency-routing.md, "What counts")."""

from __future__ import annotations

import pytest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from sluicegate import wire
from sluicegate.latency import DecayingMean, Observation, ProviderTracker, observe
from sluicegate.records import decode

from .helpers import record


def test_a_decayed_mean_forgets_by_its_half_life() -> None:
    mean = DecayingMean(half_life_s=2.0)
    assert mean.mean() is None and mean.mass(0.0) == 0
    mean.add(1.0, now=10.0)
    mean.add(3.0, now=10.0)
    assert mean.mean() == 2.0 and mean.mass(10.0) == 2.0
    assert mean.mass(12.0) == pytest.approx(1.0)  # one half-life later
    mean.add(5.0, now=12.0)  # weight 1 against the two older ones' 0.5 each
    assert mean.mean() == pytest.approx((0.5 + 1.5 + 5.0) / 2.0)
    assert mean.mass(12.0 + 2.0 * 40) == 0.0  # forgotten
    assert mean.mean() is None


def test_a_decayed_mean_knows_its_standard_error() -> None:
    mean = DecayingMean(half_life_s=2.0)
    mean.add(1.0, now=0.0)
    assert mean.standard_error() is None  # one sample: no spread to judge by
    for value in (3.0, 1.0, 3.0):
        mean.add(value, now=0.0)
    # Four samples of 1 and 3: sample variance 4/3, standard error sqrt(4/3 / 4).
    assert mean.standard_error() == pytest.approx((4 / 3 / 4) ** 0.5)
    assert mean.effective_samples() == pytest.approx(4)
    mean.add(2.0, now=2.0)  # the four weigh half now: fewer effective samples than five
    assert 4 < mean.effective_samples() < 5


def test_successes_give_the_provider_s_own_time_to_first_token() -> None:
    """From the answering attempt going out to the first body byte: a queue at the gate
    or an earlier attempt on another provider is not this provider's time."""
    queued = record("a", ttft_s=1.3, duration_s=1.9, attempts=2)
    assert observe(record("a", ttft_s=1.3, attempts=2, provider_ttft_s=0.3)) == Observation(
        False, 0.3
    )
    # Without it, the record's own TTFT, unless an earlier attempt is in it.
    assert observe(record("a", ttft_s=0.3, duration_s=0.9)) == Observation(False, 0.3)
    assert observe(queued) == Observation(False, None)
    # Without the body time point (no body), the duration stands in.
    assert observe(record("a", ttft_s=None, duration_s=0.9)) == Observation(False, 0.9)


def test_the_provider_s_time_to_first_token_is_read_off_the_log_record() -> None:
    def log_record(value: str) -> logs_pb2.LogRecord:
        body = wire.record_body(wire.LATENCY_LOG_NAME, {wire.RECORD_PROVIDER_TTFT_US: value})
        return logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value=body))

    def provider_ttft(log: logs_pb2.LogRecord) -> float | None:
        return decode(log, {}).provider_ttft_s

    assert provider_ttft(log_record("250000")) == 0.25
    assert provider_ttft(log_record("-")) is None  # Envoy had no such time point
    assert provider_ttft(log_record("1" * 16)) is None
    assert provider_ttft(logs_pb2.LogRecord()) is None


def test_streams_give_their_time_per_output_token() -> None:
    seen = observe(record("a", ttft_s=0.3, duration_s=1.3, stream=True, output_tokens=11))
    assert seen is not None and seen.tpot_s == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("status", "flags"),
    [(500, ""), (502, ""), (503, "UF"), (504, "UT"), (429, ""), (200, "UR"), (200, "UPE")],
)
def test_provider_failures_count_as_errors(status: int, flags: str) -> None:
    seen = observe(record("a", status=status, flags=flags))
    assert seen is not None and seen.failed


@pytest.mark.parametrize(
    ("status", "flags"), [(400, ""), (404, ""), (0, "DC"), (200, "DC"), (301, "")]
)
def test_a_client_s_mistake_or_departure_says_nothing(status: int, flags: str) -> None:
    assert observe(record("a", status=status, flags=flags)) is None


def test_a_tracker_smooths_each_figure_on_its_own() -> None:
    tracker = ProviderTracker(half_life_s=3.0)
    tracker.add(Observation(False, 0.2, 0.01), now=1.0)
    tracker.add(Observation(True), now=1.0)
    figures = tracker.smoothed(now=1.0)
    assert figures.ttft_s == pytest.approx(0.2)  # the failure has no time
    assert figures.tpot_s == pytest.approx(0.01)
    assert figures.error_rate == pytest.approx(0.5)
    assert figures.mass == pytest.approx(2.0) and figures.samples == 2
    assert figures.ttft_stderr_s is None  # one TTFT sample
    # Two failures of two are not a certain 100%: (2 + 1) / (2 + 2) +- 0.22.
    failing = ProviderTracker(half_life_s=3.0)
    failing.add(Observation(True), now=1.0)
    failing.add(Observation(True), now=1.0)
    assert failing.smoothed(now=1.0).error_stderr == pytest.approx((0.75 * 0.25 / 4) ** 0.5)
