"""Benchmark: latency-aware routing, a provider's share while its time to first token rises
5x and recovers, and the weights of steady providers over five minutes.

Not collected by pytest. Run from the repository root (venv active, Envoy on PATH):

    python -m benchmarks.latency_routing            # prints the report
    python -m benchmarks.latency_routing --write    # and records it in RESULTS.md

Options: --clients N (default 4), --steady-s S (default 300; 0 skips the steady run).

`sluicegate up` (one Envoy worker) with two mock providers, `fast` and `slow`, each a
TTFT of 50 ms and one output token, on one `routing: latency` route, weights 1:1; N
closed-loop clients send non-streamed chat completions throughout. Rise and recovery: at
t = 20 s `slow`'s TTFT becomes 250 ms (POST /mock/config), at t = 60 s 50 ms again, until
t = 120 s. Each second: `slow`'s share of the requests the mocks answered in that second
(their /mock/stats), and its share as pushed to Envoy (the control plane's /status).
Steady: a fresh stack, both providers as configured, for --steady-s seconds; how far the
pushed weights moved, and how often anything was pushed.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.results import machine, today
from benchmarks.harness.stack import Ports, UpStack
from sluicegate.testing.steady_load import Load, steady_load

SECTION = "Latency-aware routing"
MODEL = "m"
TTFT_MS = 50
RISE_AT_S = 20
RECOVER_AT_S = 60
LENGTH_S = 120
PROVIDERS = ("fast", "slow")
ENDPOINT_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def latency_doc(ports: Ports) -> dict[str, Any]:
    return {
        "version": 1,
        "admission": {"lane": "exact"},  # the routing stage (the default is lane_rules.py's)
        "sluicegate": ports.sluicegate(),
        "listeners": [{"name": "gateway", "address": "127.0.0.1", "port": ports.listener}],
        "providers": [
            {
                "name": name,
                "base_url": f"http://127.0.0.1:{ports.providers[name]}/v1",
                "mock": {"models": [MODEL], "ttft_ms": TTFT_MS, "itl_ms": 5, "output_tokens": 1},
            }
            for name in PROVIDERS
        ],
        "routes": [
            {
                "name": "chat",
                "models": [MODEL],
                "routing": "latency",
                "backends": [{"provider": name} for name in PROVIDERS],
            }
        ],
    }


def _json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


@dataclass(frozen=True)
class Second:
    t: int  # seconds since the load began
    answered: dict[str, int]  # by provider, during this second
    pushed_share: float  # slow's share as pushed, at the end of the second
    ttft_s: float | None  # slow's smoothed TTFT then

    @property
    def observed_share(self) -> float | None:
        total = sum(self.answered.values())
        return self.answered["slow"] / total if total else None


class Run:
    """One stack under load, sampled once a second."""

    def __init__(self, work: Path, clients: int) -> None:
        self.ports = Ports.pick(PROVIDERS)
        self.stack = UpStack(work, latency_doc(self.ports))
        self.clients = clients
        self.seconds: list[Second] = []
        self.versions: list[dict[str, str]] = []
        self.load: Load | None = None

    def mock(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports.providers[name]}"

    def counts(self) -> dict[str, int]:
        return {
            name: int(_json(self.mock(name) + "/mock/stats")["requests_total"])
            for name in PROVIDERS
        }

    def status(self) -> dict[str, Any]:
        found: dict[str, Any] = _json(self.stack.http + "/status")
        return found

    def sample(self, length_s: int, events: dict[int, int]) -> None:
        """Load for `length_s` seconds; at second t in `events`, slow's TTFT becomes
        events[t] ms."""
        self.stack.wait_serving(MODEL, {})
        with steady_load(self.stack.url, MODEL, {}, clients=self.clients) as load:
            self.load = load
            start = time.monotonic()
            before = self.counts()
            for t in range(length_s):
                if t in events:
                    _json(self.mock("slow") + "/mock/config", {"ttft_ms": events[t]})
                time.sleep(max(0.0, start + t + 1 - time.monotonic()))
                now = self.counts()
                status = self.status()
                slow = status["routing"]["chat"]["slow"]
                self.seconds.append(
                    Second(
                        t, {n: now[n] - before[n] for n in PROVIDERS}, slow["share"], slow["ttft_s"]
                    )
                )
                self.versions.append(status["versions"])
                before = now

    def failed(self) -> int:
        return 0 if self.load is None else sum(1 for o in self.load.outcomes if not o.ok)

    def requests(self) -> int:
        return 0 if self.load is None else len(self.load.outcomes)

    def pushes(self) -> tuple[int, set[str]]:
        """EDS versions seen change, and every other type whose version changed."""
        eds = sum(
            1 for a, b in zip(self.versions, self.versions[1:], strict=False)
            if a.get(ENDPOINT_TYPE) != b.get(ENDPOINT_TYPE)
        )  # fmt: skip
        others = {
            t
            for a, b in zip(self.versions, self.versions[1:], strict=False)
            for t in a
            if t != ENDPOINT_TYPE and a[t] != b.get(t)
        }
        return eds, others


def _first(seconds: list[Second], since: int, holds: Callable[[Second], bool]) -> int | None:
    """Seconds from `since` to the end of the first second (at or after it) for which
    `holds(second)` is true."""
    for second in seconds:
        if second.t >= since and holds(second):
            return second.t + 1 - since
    return None


def _windowed(seconds: list[Second], t: int, width: int) -> float | None:
    """slow's observed share over the `width` seconds ending with second t."""
    chosen = [s for s in seconds if t - width < s.t <= t]
    total = sum(sum(s.answered.values()) for s in chosen)
    return sum(s.answered["slow"] for s in chosen) / total if total else None


def _plot(seconds: list[Second]) -> list[str]:
    """x: one column a second; y: share in 5% steps. `*` observed, `o` pushed, `#` both."""
    rows = []
    for level in range(60, -1, -5):
        line = ""
        for second in seconds:
            observed = second.observed_share
            marks = {
                "*": observed is not None and round(observed * 20) * 5 == level,
                "o": round(second.pushed_share * 20) * 5 == level,
            }
            line += "#" if all(marks.values()) else next((m for m, on in marks.items() if on), " ")
        rows.append(f"{level:>3}% |{line.rstrip()}")
    rows.append("     +" + "".join("|" if s.t % 10 == 0 else "-" for s in seconds))
    rows.append("      " + "".join(f"{t:<10}" for t in range(0, len(seconds), 10)).rstrip())
    return rows


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def rise_report(run: Run) -> list[str]:
    seconds = run.seconds
    to_pushed = _first(seconds, RISE_AT_S, lambda s: s.pushed_share < 0.20)
    to_observed = _first(seconds, RISE_AT_S, lambda s: (s.observed_share or 1) < 0.20)
    lowest = min(s.pushed_share for s in seconds if RISE_AT_S <= s.t < RECOVER_AT_S)
    back_pushed = _first(seconds, RECOVER_AT_S, lambda s: abs(s.pushed_share - 0.5) <= 0.05)
    back_observed = _first(
        seconds, RECOVER_AT_S, lambda s: abs((_windowed(seconds, s.t, 3) or 0) - 0.5) <= 0.05
    )
    home = _first(seconds, RECOVER_AT_S, lambda s: s.pushed_share == 0.5)
    eds, others = run.pushes()
    rate = run.requests() / len(seconds) if seconds else 0.0

    def took(value: int | None) -> str:
        return "never" if value is None else f"{value} s"

    lines = [
        "### Rise and recovery",
        "",
        f"{run.clients} clients, {rate:.0f} requests/s answered. `slow`'s TTFT 50 → 250 ms at "
        f"t = {RISE_AT_S} s, back to 50 ms at t = {RECOVER_AT_S} s.",
        "",
        "| | aim | measured |",
        "|---|---|---:|",
        f"| rise → `slow`'s pushed share below 20% | within 15 s | {took(to_pushed)} |",
        f"| rise → `slow`'s answered share (that second) below 20% | | {took(to_observed)} |",
        f"| lowest pushed share while slow (the floor is 5%) | | {lowest:.1%} |",
        "| recovery → pushed share within 10% of its configured 50% | within 60 s | "
        f"{took(back_pushed)} |",
        f"| recovery → answered share (3 s window) within 10% of 50% | | {took(back_observed)} |",
        f"| recovery → exactly the configured weights again | | {took(home)} |",
        f"| requests failed | 0 | {run.failed()} of {run.requests()} |",
        f"| EDS pushes; other xDS types changed | | {eds}; {', '.join(sorted(others)) or 'none'} |",
        "",
        "`slow`'s share per second: `*` of the requests answered in that second, `o` as",
        "pushed to Envoy at its end (`#` both).",
        "",
        "```",
        *_plot(seconds),
        "```",
        "",
    ]
    third = (len(seconds) + 2) // 3
    lines.append("| t (s) | answered | pushed | TTFT (ms) " * 3 + "|")
    lines.append("|---:|---:|---:|---:" * 3 + "|")
    for row in range(third):
        cells = []
        for column in range(3):
            index = row + column * third
            if index < len(seconds):
                s = seconds[index]
                ttft = "-" if s.ttft_s is None else f"{s.ttft_s * 1000:.0f}"
                cells.append(
                    f"| {s.t} | {_share(s.observed_share)} | {s.pushed_share:.0%} | {ttft} "
                )
            else:
                cells.append("| | | | ")
        lines.append("".join(cells) + "|")
    return lines


def steady_report(run: Run, length_s: int) -> list[str]:
    seconds = run.seconds
    moved = max(abs(s.pushed_share - 0.5) / 0.5 for s in seconds)
    eds, others = run.pushes()
    windows = [
        share
        for t in range(9, len(seconds), 10)
        if (share := _windowed(seconds, t, 10)) is not None
    ]
    return [
        "### Steady providers",
        "",
        f"Both providers as configured (TTFT 50 ms), {run.clients} clients, {length_s} s, "
        f"{run.requests() / length_s:.0f} requests/s answered.",
        "",
        "| | aim | measured |",
        "|---|---|---:|",
        f"| largest move of a pushed weight from its configured value | < 5% | {moved:.1%} |",
        f"| EDS pushes; other xDS types changed | | {eds}; {', '.join(sorted(others)) or 'none'} |",
        f"| `slow`'s answered share per 10 s (lowest, highest) | | "
        f"{min(windows):.1%}, {max(windows):.1%} |",
        f"| requests failed | 0 | {run.failed()} of {run.requests()} |",
    ]


def run_stack(work: Path, clients: int, length_s: int, events: dict[int, int]) -> Run:
    run = Run(work, clients)
    try:
        run.sample(length_s, events)
    finally:
        run.stack.stop()
    return run


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--steady-s", type=int, default=300)
    args = parser.parse_args(argv)
    command = command_line("benchmarks.latency_routing", argv)
    with tempfile.TemporaryDirectory(prefix="sluicegate-latency-") as tmp:
        events = {RISE_AT_S: 5 * TTFT_MS, RECOVER_AT_S: TTFT_MS}
        rise = run_stack(Path(tmp) / "rise", args.clients, LENGTH_S, events)
        steady = (
            run_stack(Path(tmp) / "steady", args.clients, args.steady_s, {})
            if args.steady_s
            else None
        )
    lines = [
        f"`{command}` — {today()}; {machine()}.",
        "",
        "`sluicegate up` (one Envoy worker), two mock providers `fast` and `slow` (TTFT 50 ms,",
        "one output token, non-streamed answers) on one `routing: latency` route, weights 1:1,",
        "closed-loop clients throughout (docs/latency-routing.md).",
        "",
        *rise_report(rise),
    ]
    if steady is not None:
        lines += ["", *steady_report(steady, args.steady_s)]
    record(SECTION, "\n".join(lines), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
