"""Records, a small model and a simulated route for the latency router's tests."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from sluicegate.config import Config
from sluicegate.latency import LatencyRouter, Weighing
from sluicegate.model import Gateway, build_model
from sluicegate.records import RequestRecord

MODEL = """
version: 1
listeners: [{name: main, port: 10000}]
providers:
  - {name: fast, base_url: "http://127.0.0.1:18081/v1"}
  - {name: slow, base_url: "http://127.0.0.1:18082/v1"}
  - {name: spare, base_url: "http://127.0.0.1:18083/v1"}
routes:
  - name: chat
    models: [m]
    routing: latency
    backends: [{provider: fast}, {provider: slow}, {provider: spare, priority: 1}]
  - {name: plain, models: [p], backends: [{provider: fast, weight: 3}, {provider: slow}]}
"""


def document(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MODEL)
    doc.update(changes)
    return doc


def gateway(doc: Mapping[str, Any] | None = None, drained: frozenset[str] = frozenset()) -> Gateway:
    return build_model(Config.model_validate(doc or document()), {}, drained)


def record(
    provider: str,
    *,
    route: str = "chat",
    status: int = 200,
    ttft_s: float | None = 0.05,
    duration_s: float | None = 0.06,
    flags: str = "",
    attempts: int = 1,
    stream: bool = False,
    output_tokens: int | None = None,
    provider_ttft_s: float | None = None,
) -> RequestRecord:
    return RequestRecord(
        route=route,
        provider=provider,
        model="m",
        model_sent="m",
        tenant="",
        key_name="",
        priority="",
        scenario="",
        status=status,
        status_class=f"{status // 100}xx" if status else "none",
        flags=flags,
        code_details="",
        error_code="",
        attempts=attempts,
        stream=stream,
        queue_s=None,
        first_upstream_byte_s=None,
        ttft_s=ttft_s,
        first_downstream_byte_s=None,
        duration_s=duration_s,
        input_tokens=None,
        output_tokens=output_tokens,
        start_unix_ns=0,
        provider_ttft_s=provider_ttft_s,
    )


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class SimulatedRoute:
    """Route `chat`'s first level (fast, slow) under `rate` requests a second, each sent to
    a provider by the weights last pushed (as Envoy would) and recorded when it ends; one
    tick a second. TTFTs are the providers' base x a noise factor."""

    rate: float = 30.0
    noise: float = 0.2  # each TTFT is base x uniform(1 - noise, 1 + noise)
    ttft_s: dict[str, float] = field(default_factory=lambda: {"fast": 0.05, "slow": 0.05})
    failing: dict[str, float] = field(default_factory=dict)  # provider -> failure share
    weighing: Weighing = field(default_factory=Weighing)
    seed: int = 7

    def __post_init__(self) -> None:
        self.clock = Clock()
        self.router = LatencyRouter(self.weighing, clock=self.clock)
        self.router.load(gateway())
        self.rng = random.Random(self.seed)
        self.pending: list[tuple[float, RequestRecord]] = []
        self.sent: dict[str, int] = {"fast": 0, "slow": 0}

    def pushed_share(self, provider: str) -> float:
        weights = self.router.weights()["chat"]
        return weights[provider] / (weights["fast"] + weights["slow"])

    def run(self, seconds: float) -> list[float]:
        """Advance `seconds`; `slow`'s pushed share after each tick."""
        shares = []
        end = self.clock.now + seconds
        next_tick = self.clock.now + self.weighing.tick_s
        while self.clock.now < end:
            now = self.clock.now + self.rng.expovariate(self.rate)
            while next_tick <= min(now, end):
                self._deliver(next_tick)
                self.clock.now = next_tick
                self.router.tick()
                shares.append(self.pushed_share("slow"))
                next_tick += self.weighing.tick_s
            if now >= end:
                self.clock.now = end
                break
            self.clock.now = now
            self._deliver(now)
            self._send(now)
        return shares

    def _send(self, now: float) -> None:
        provider = "slow" if self.rng.random() < self.pushed_share("slow") else "fast"
        self.sent[provider] += 1
        ttft = self.ttft_s[provider] * self.rng.uniform(1 - self.noise, 1 + self.noise)
        if self.rng.random() < self.failing.get(provider, 0.0):
            made = record(provider, status=503, ttft_s=None, duration_s=ttft)
        else:
            made = record(provider, ttft_s=ttft, duration_s=ttft + 0.01)
        self.pending.append((now + ttft + 0.01 + 0.1, made))  # + the log's 100 ms flush

    def _deliver(self, now: float) -> None:
        due = sorted((item for item in self.pending if item[0] <= now), key=lambda i: i[0])
        self.pending = [item for item in self.pending if item[0] > now]
        for at, made in due:
            saved = self.clock.now
            self.clock.now = at
            self.router.observe(made)
            self.clock.now = saved
