"""What one comparison run measures, and for how long: the full plan (28 minutes on 2
cores with 3 rounds) and `--quick`'s (one round, short and fewer steps: about 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# The request: a 256-token synthetic prompt (the bench's default, about 1.3 kB of body,
# which sluicegate buffers and sends to ext_proc) asking for ANSWER_TOKENS tokens.
INPUT_TOKENS: Final = "fixed:256"
ANSWER_TOKENS: Final = 20
# The paced stream: the upstream sends ANSWER_TOKENS content events this far apart.
CHUNK_INTERVAL_MS: Final = 20.0
# A stall: a gap between two content events of one stream longer than this many
# intervals (here 100 ms).
STALL_INTERVALS: Final = 5.0
# The frontier: the most requests/s carried with the e2e p99 at or under each of these.
P99_LIMITS_MS: Final = (1.0, 5.0, 10.0, 50.0, 100.0)
# The load generator (one process) is saturated above this share of a core, or when its
# event loop runs a timer this many stall lengths late (it then sees gaps of its own).
GENERATOR_SATURATED: Final = 0.9
GENERATOR_LAG_STALLS: Final = 0.5


@dataclass(frozen=True)
class Phase:
    """A step's warm-up (not measured; its connections opened) and measured window."""

    warmup_s: float
    duration_s: float

    @property
    def total_s(self) -> float:
        return self.warmup_s + self.duration_s


@dataclass(frozen=True)
class Plan:
    rounds: int
    # 1. added latency: non-streamed, concurrency 1
    latency: Phase
    # 2-3. the throughput frontier and CPU per request: one non-streamed concurrency sweep
    sweep: tuple[int, ...]
    sweep_phase: Phase
    # 5. memory "under load": RSS at the end of this sweep step
    memory_concurrency: int
    # CPU per request compared at this sweep step (every gateway carries it)
    cpu_concurrency: int
    # 4. streams: added TTFT and inter-chunk latency at this concurrency ...
    stream_concurrency: int
    stream_phase: Phase
    # ... and the concurrent streams sustained, stepping up through these
    stream_ramp: tuple[int, ...]
    stream_ramp_phase: Phase
    # CPU per stream compared at this ramp step
    stream_cpu_concurrency: int

    @property
    def stall_s(self) -> float:
        return STALL_INTERVALS * CHUNK_INTERVAL_MS / 1000


FULL: Final = Plan(
    rounds=3,
    latency=Phase(1.0, 5.0),
    sweep=(1, 2, 4, 8, 16, 32, 64, 128),
    sweep_phase=Phase(1.0, 3.0),
    memory_concurrency=32,
    cpu_concurrency=32,
    stream_concurrency=4,
    stream_phase=Phase(1.0, 6.0),
    stream_ramp=(16, 32, 64, 128, 256, 512),
    stream_ramp_phase=Phase(1.0, 3.0),
    stream_cpu_concurrency=64,
)

QUICK: Final = Plan(
    rounds=1,
    latency=Phase(0.5, 2.0),
    sweep=(1, 8, 32),
    sweep_phase=Phase(0.5, 1.5),
    memory_concurrency=32,
    cpu_concurrency=32,
    stream_concurrency=4,
    stream_phase=Phase(0.5, 3.0),
    stream_ramp=(16, 64, 256),
    stream_ramp_phase=Phase(0.5, 1.5),
    stream_cpu_concurrency=64,
)
