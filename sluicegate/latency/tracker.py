"""What one request record says about the provider that answered it, and a provider's
smoothed time to first token, time per output token and error rate.

Which records count (docs/latency-routing.md, "What counts"):
- a failure: a 5xx, a 429 (the provider is out of capacity, whoever's limit it is), or an
  upstream failure flag on any status (a stream reset after its 200, a timeout, a
  refused connection);
- a success: a 2xx. Its time to first token is the provider's own: from the answering
  attempt's request going out to the provider's first body byte (for a non-streamed
  answer, the whole answer), so neither the gateway's queue nor an earlier attempt on
  another provider counts against it. Without that time point, the record's TTFT
  (from the request's first byte) when there was one attempt;
- nothing: a client that left first (flag DC), and every other answer (3xx, 4xx but 429):
  a client's mistake says nothing about a provider's speed or health.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from sluicegate.local_replies import split_flags
from sluicegate.records import RequestRecord, time_per_output_token

from .smoothing import DecayingMean

# Envoy's response flags that blame the upstream: connection failure, timeout, connection
# termination, remote reset, retries exhausted, protocol error, overflow, max stream
# duration, stream idle timeout.
UPSTREAM_FAILURE_FLAGS: Final = frozenset(
    {"UF", "UT", "UC", "UR", "URX", "UPE", "UO", "UMSDR", "SI"}
)
_CLIENT_LEFT: Final = "DC"
_RATE_LIMITED: Final = 429


@dataclass(frozen=True, slots=True)
class Observation:
    failed: bool
    ttft_s: float | None = None  # a success's time to first token, when it is the provider's
    tpot_s: float | None = None  # a success's time per output token (streams with usage or counted)


FAILED: Final = Observation(failed=True)


def observe(record: RequestRecord) -> Observation | None:
    """What `record` says about its provider, or None when it says nothing. Its time to
    first token is the provider's own (record.provider_ttft_s), when Envoy had it."""
    flags = split_flags(record.flags)
    if _CLIENT_LEFT in flags:
        return None
    if record.status >= 500 or record.status == _RATE_LIMITED or flags & UPSTREAM_FAILURE_FLAGS:
        return FAILED
    if not 200 <= record.status < 300:
        return None
    ttft = record.provider_ttft_s
    if ttft is None and record.attempts <= 1:
        ttft = record.ttft_s if record.ttft_s is not None else record.duration_s
    return Observation(failed=False, ttft_s=ttft, tpot_s=time_per_output_token(record))


@dataclass(frozen=True, slots=True)
class Smoothed:
    """A provider's smoothed figures at one moment (None: no recent sample of that kind)."""

    ttft_s: float | None
    tpot_s: float | None
    error_rate: float | None
    mass: float  # recent evidence, in samples (decayed)
    samples: int  # records counted since the route's provider was first seen
    # How far to trust ttft_s and error_rate: their standard errors (None: too few samples).
    ttft_stderr_s: float | None = None
    error_stderr: float | None = None


@dataclass(slots=True)
class ProviderTracker:
    """One provider of one route: decayed means of its TTFT, TPOT and failures."""

    half_life_s: float
    samples: int = 0
    _ttft: DecayingMean = field(init=False)
    _tpot: DecayingMean = field(init=False)
    _failures: DecayingMean = field(init=False)  # 1 per failure, 0 per success

    def __post_init__(self) -> None:
        self._ttft = DecayingMean(self.half_life_s)
        self._tpot = DecayingMean(self.half_life_s)
        self._failures = DecayingMean(self.half_life_s)

    def add(self, observation: Observation, now: float) -> None:
        self.samples += 1
        self._failures.add(1.0 if observation.failed else 0.0, now)
        if observation.ttft_s is not None:
            self._ttft.add(observation.ttft_s, now)
        if observation.tpot_s is not None:
            self._tpot.add(observation.tpot_s, now)

    def smoothed(self, now: float) -> Smoothed:
        mass = self._failures.mass(now)
        error_rate = self._failures.mean() if mass else None
        has_ttft = self._ttft.mass(now) > 0
        return Smoothed(
            ttft_s=self._ttft.mean() if has_ttft else None,
            tpot_s=self._tpot.mean() if self._tpot.mass(now) else None,
            error_rate=error_rate,
            mass=mass,
            samples=self.samples,
            ttft_stderr_s=self._ttft.standard_error() if has_ttft else None,
            error_stderr=None
            if error_rate is None
            else _rate_stderr(error_rate, self._failures.effective_samples()),
        )


def _rate_stderr(rate: float, samples: float) -> float:
    """A failure rate's standard error, Agresti-Coull style (one failure and one success
    added), so that two failures out of two are not taken as a certain 100%."""
    adjusted = (rate * samples + 1) / (samples + 2)
    return math.sqrt(adjusted * (1 - adjusted) / (samples + 2))
