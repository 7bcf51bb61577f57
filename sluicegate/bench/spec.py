"""What one bench run is: the endpoint, the load shape, the request mix, the bounds.

`BenchSpec` is the whole of it, for the command line and for Python callers alike
(docs/bench.md, "From Python"). Strings are accepted where the command line takes them
(`input_tokens="uniform:10-200"`, `slo="ttft_p95=2s"`); every check names the flag a
command-line user would fix.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sluicegate.bench.distributions import Lengths, parse_lengths
from sluicegate.bench.keys import Secret, key_from_env, key_from_file
from sluicegate.bench.slo import Slo, parse_slo

DEFAULT_INPUT: Final = "fixed:256"
DEFAULT_OUTPUT: Final = "fixed:128"
REFUSAL_HEADER: Final = "x-sluicegate-refusal"
QUEUE_HEADER: Final = "x-sluicegate-queue-ms"
# wire.PRIORITY_HEADER and wire.SCENARIO_HEADER, written out: the bench imports nothing of
# the gateway (tests/bench/test_units.py holds them equal).
PRIORITY_HEADER: Final = "x-sluicegate-priority"
SCENARIO_HEADER: Final = "x-sluicegate-scenario"
MAX_INFLIGHT: Final = 10_000


class SpecError(ValueError):
    """A bad setting; `flag` is the command-line flag that sets it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message


def _lengths(value: Lengths | str | None, flag: str) -> Lengths | None:
    if value is None or isinstance(value, Lengths):
        return value
    try:
        return parse_lengths(value)
    except ValueError as err:
        raise SpecError(flag, str(err)) from None


@dataclass(frozen=True)
class Scenario:
    """A named part of the mix: its share of requests, its lengths or prompts, its
    tenant key (from an environment variable or a file) and its priority class."""

    name: str
    share: float = 1.0
    input_tokens: Lengths | str | None = None
    output_tokens: Lengths | str | None = None
    prompts: str | Path | None = None
    key_env: str | None = None
    key_file: str | Path | None = None
    api_key: Secret | str | None = field(default=None, repr=False, compare=False)
    priority: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        where = f"--scenario {self.name}"
        if not self.name or any(c in self.name for c in ",=\r\n"):
            raise SpecError("--scenario", f"a scenario needs a name without , or =: {self.name!r}")
        if not (self.share > 0 and math.isfinite(self.share)):
            raise SpecError(where, f"share must be > 0, got {self.share}")
        object.__setattr__(self, "input_tokens", _lengths(self.input_tokens, f"{where} input"))
        object.__setattr__(self, "output_tokens", _lengths(self.output_tokens, f"{where} output"))
        given = isinstance(self.api_key, str)  # a Secret here is a resolved key_env/key_file
        if sum((self.key_env is not None, self.key_file is not None, given)) > 1:
            raise SpecError(where, "give one of key-env and key-file")
        try:
            if self.key_env is not None:
                object.__setattr__(self, "api_key", key_from_env(self.key_env))
            elif self.key_file is not None:
                object.__setattr__(self, "api_key", key_from_file(self.key_file))
            elif isinstance(self.api_key, str):
                object.__setattr__(self, "api_key", Secret(self.api_key))
        except ValueError as err:
            raise SpecError(where, str(err)) from None
        if self.priority is not None and not _header_value_ok(self.priority):
            raise SpecError(where, f"priority is not a header value: {self.priority!r}")
        if self.prompts is not None and not Path(self.prompts).is_file():
            raise SpecError(where, f"prompts file not found: {self.prompts}")

    @property
    def key(self) -> Secret | None:
        return self.api_key if isinstance(self.api_key, Secret) else None

    @property
    def input_lengths(self) -> Lengths | None:
        return self.input_tokens if isinstance(self.input_tokens, Lengths) else None

    @property
    def output_lengths(self) -> Lengths | None:
        return self.output_tokens if isinstance(self.output_tokens, Lengths) else None

    def parameters(self) -> dict[str, Any]:
        """As in the JSON's parameters: where the key comes from, never the key."""
        key = (
            f"env:{self.key_env}" if self.key_env
            else f"file:{self.key_file}" if self.key_file
            else "given" if self.api_key is not None else None
        )  # fmt: skip
        return {
            "name": self.name, "share": self.share,
            "input_tokens": self.input_lengths.text if self.input_lengths else None,
            "output_tokens": self.output_lengths.text if self.output_lengths else None,
            "prompts": str(self.prompts) if self.prompts else None,
            "key": key, "priority": self.priority, "model": self.model,
        }  # fmt: skip


def _header_value_ok(value: str) -> bool:
    return bool(value) and all(32 <= ord(c) < 127 for c in value)


@dataclass(frozen=True)
class BenchSpec:
    """One run (or one sweep) against an OpenAI-compatible endpoint.

    Load shape: `concurrency` (closed loop) or `rate` (open loop, Poisson arrivals,
    req/s), optionally ramped (`ramp=(from, to)` over the duration) or swept (`sweep`,
    starting at the given value). Bounded by `duration_s` or `requests`.
    """

    url: str
    api_key: Secret | str | None = field(default=None, repr=False, compare=False)
    model: str | None = None
    stream: bool = True
    stream_usage: bool = True
    concurrency: int | None = None
    rate: float | None = None
    ramp: tuple[float, float] | None = None
    max_inflight: int = MAX_INFLIGHT
    duration_s: float | None = None
    requests: int | None = None
    warmup_s: float = 0.0
    input_tokens: Lengths | str = DEFAULT_INPUT
    output_tokens: Lengths | str | None = None
    prompts: str | Path | None = None
    scenarios: tuple[Scenario, ...] = ()
    ignore_eos: bool = False
    seed: int = 0
    timeout_s: float = 600.0
    processes: int | None = None  # None: auto (workers.auto_processes)
    slo: Slo | str | None = None
    refusal_header: str = REFUSAL_HEADER
    queue_header: str = QUEUE_HEADER
    headers: tuple[tuple[str, str], ...] = ()
    sweep: bool = False
    sweep_steps: int = 12
    sweep_factor: float = 2.0
    sweep_resolution: float = 0.05

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise SpecError("--url", "expected http://HOST:PORT or https://... (not shown)")
        if isinstance(self.api_key, str):
            try:
                object.__setattr__(self, "api_key", Secret(self.api_key))
            except ValueError as err:
                raise SpecError("--api-key", str(err)) from None
        object.__setattr__(self, "input_tokens", _lengths(self.input_tokens, "--input-tokens"))
        object.__setattr__(self, "output_tokens", _lengths(self.output_tokens, "--output-tokens"))
        if isinstance(self.slo, str):
            try:
                object.__setattr__(self, "slo", parse_slo(self.slo))
            except ValueError as err:
                raise SpecError("--slo", str(err)) from None
        self._check_shape()
        self._check_bounds()
        names = [s.name for s in self.scenarios]
        if len(set(names)) != len(names):
            raise SpecError("--scenario", f"scenario names must differ: {', '.join(names)}")
        if self.prompts is not None and not Path(self.prompts).is_file():
            raise SpecError("--prompts", f"file not found: {self.prompts}")
        for name, value in self.headers:
            if not name or ":" in name or not _header_value_ok(name + value):
                raise SpecError("--header", f"not a header: {name!r}")
        for flag, header in (("--refusal-header", self.refusal_header),
                             ("--queue-header", self.queue_header)):  # fmt: skip
            if not header or ":" in header or not _header_value_ok(header):
                raise SpecError(flag, f"not a header name: {header!r}")
        object.__setattr__(self, "refusal_header", self.refusal_header.lower())
        object.__setattr__(self, "queue_header", self.queue_header.lower())

    def _check_shape(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise SpecError("--concurrency", "give one of --concurrency N and --rate R")
        if self.concurrency is not None and self.concurrency < 1:
            raise SpecError("--concurrency", f"must be >= 1, got {self.concurrency}")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise SpecError("--rate", f"must be > 0 requests/s, got {self.rate}")
        if self.max_inflight < 1:
            raise SpecError("--max-inflight", f"must be >= 1, got {self.max_inflight}")
        if self.ramp is not None:
            if self.sweep:
                raise SpecError("--ramp", "a sweep sets the load itself; drop --ramp")
            if self.duration_s is None:
                raise SpecError("--ramp", "a ramp runs over --duration; give it")
            low, high = self.ramp
            if self.concurrency is not None and not (low >= 0 and high >= 1):
                raise SpecError("--ramp", "concurrency ramps need FROM >= 0 and TO >= 1")
            if self.rate is not None and not (low >= 0 and high > 0 and math.isfinite(high)):
                raise SpecError("--ramp", "rate ramps need FROM >= 0 and TO > 0")
        if self.sweep:
            if self.slo is None:
                raise SpecError("--sweep", "a sweep needs objectives: give --slo")
            if self.sweep_steps < 2:
                raise SpecError("--sweep-steps", f"must be >= 2, got {self.sweep_steps}")
            if not self.sweep_factor > 1:
                raise SpecError("--sweep-factor", f"must be > 1, got {self.sweep_factor}")
            if not 0 < self.sweep_resolution < 1:
                raise SpecError(
                    "--sweep-resolution", f"must be within 0..1, got {self.sweep_resolution}"
                )

    def _check_bounds(self) -> None:
        if (self.duration_s is None) == (self.requests is None):
            raise SpecError("--duration", "give one of --duration and --requests")
        if self.duration_s is not None and not (
            self.duration_s > 0 and math.isfinite(self.duration_s)
        ):
            raise SpecError("--duration", f"must be > 0, got {self.duration_s}")
        if self.requests is not None and self.requests < 1:
            raise SpecError("--requests", f"must be >= 1, got {self.requests}")
        if not (self.warmup_s >= 0 and math.isfinite(self.warmup_s)):
            raise SpecError("--warmup", f"must be >= 0, got {self.warmup_s}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise SpecError("--timeout", f"must be > 0, got {self.timeout_s}")
        if self.processes is not None and not 1 <= self.processes <= 4 * (os.cpu_count() or 1):
            raise SpecError("--processes", f"must be within 1..4x the cores, got {self.processes}")

    # ---- the normalized values (the fields also accept strings) ----------------------

    @property
    def key(self) -> Secret | None:
        return self.api_key if isinstance(self.api_key, Secret) else None

    @property
    def input_lengths(self) -> Lengths:
        assert isinstance(self.input_tokens, Lengths)
        return self.input_tokens

    @property
    def output_lengths(self) -> Lengths | None:
        return self.output_tokens if isinstance(self.output_tokens, Lengths) else None

    @property
    def objectives(self) -> Slo | None:
        return self.slo if isinstance(self.slo, Slo) else None

    @property
    def shape(self) -> str:
        return "closed" if self.concurrency is not None else "open"

    @property
    def load(self) -> float:
        """The load value: concurrency (closed loop) or requests/s (open loop)."""
        return float(self.concurrency) if self.concurrency is not None else float(self.rate or 0)

    def parameters(self, model: str | None = None) -> dict[str, Any]:
        """The run's parameters for the JSON (never a key: only where it came from)."""
        slo = self.objectives
        return {
            "url": self.url,
            "model": model or self.model,
            "key": "given" if self.key is not None else None,
            "stream": self.stream,
            "stream_usage": self.stream and self.stream_usage,
            "shape": self.shape,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "ramp": list(self.ramp) if self.ramp else None,
            "max_inflight": self.max_inflight,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "warmup_s": self.warmup_s,
            "input_tokens": self.input_lengths.text,
            "output_tokens": self.output_lengths.text if self.output_lengths else None,
            "prompts": str(self.prompts) if self.prompts else None,
            "scenarios": [s.parameters() for s in self.scenarios],
            "ignore_eos": self.ignore_eos,
            "seed": self.seed,
            "timeout_s": self.timeout_s,
            "processes": self.processes,
            "slo": slo.to_json() if slo else None,
            "refusal_header": self.refusal_header,
            "queue_header": self.queue_header,
            "headers": sorted(name for name, _ in self.headers),
            "sweep": {
                "steps": self.sweep_steps, "factor": self.sweep_factor,
                "resolution": self.sweep_resolution,
            } if self.sweep else None,
        }  # fmt: skip
