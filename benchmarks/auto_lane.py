"""Benchmark: the auto lane's bound (issue 12), a tenant pushing three times its limit
over windows of the limit's real length.

Not collected by pytest. Run from the repository root (venv active, Envoy on PATH):

    python -m benchmarks.auto_lane            # prints the report
    python -m benchmarks.auto_lane --write    # and records it in RESULTS.md

Options: --window-s S (default 60), --limit N requests per window (default 120),
--push-s S (default 150).

`sluicegate up` (one Envoy worker) with one mock provider on one route, and `lane: auto`
tenants (admission.auto_lane's defaults), each limited to N requests per S seconds, its
key's `secret` in a file. Two runs, one tenant each: a client sends 3N/S requests a second
for --push-s seconds (open loop, each request sent on time whatever the answers take),
(a) short non-streamed chat completions, (b) streams of about 3 s. Reported for each: the
most requests admitted in any S seconds (by send time) against the limit and the bound
of docs/fast-lane.md ("The auto lane": the limit plus the rate times 0.6 s), every
answer's status, when the tenant moved to the exact lane and back (the control plane's
/status `lanes`), and Envoy's listener updates (none expected: a move pushes the key
check alone).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import secrets
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.answers import error_code
from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.results import machine, today
from benchmarks.harness.stack import ROOT, Ports, UpStack, probe_headers
from sluicegate import wire
from sluicegate.config import AutoLane, hash_key
from sluicegate.wire import IN_FLIGHT_FLUSH_MS
from sluicegate.xds.translate.record_log import LOG_FLUSH_MS

SECTION = "The auto lane (issue 12, step 3)"
MODEL = "m"
PROVIDER = "mock"
LDS_UPDATES = "listener_manager.lds.update_success"
# The docs' margin: a request is counted at its end or IN_FLIGHT_FLUSH_MS after it began,
# and its record takes up to LOG_FLUSH_MS more to reach the control plane.
COUNTED_WITHIN_S = (IN_FLIGHT_FLUSH_MS + LOG_FLUSH_MS) / 1000
HOLD_S = AutoLane().hold / 1000  # admission.auto_lane's default, which the run keeps
AIM = 1.1  # issue 12: at most 1.1 times the limit in any window
# Streams of 30 events 100 ms apart, about 3 s each (as tests/e2e/test_auto_lane.py).
LONG_STREAM = {"x-mock-output-tokens": "30", "x-mock-itl-ms": "100"}
STATUS_POLL_S = 0.2
# A tenant whose limit the run never nears: it waits for the stack to serve, so no run's
# tenant is charged for that.
PROBE = "probe"


@dataclass(frozen=True)
class Kind:
    """One run's requests."""

    tenant: str
    title: str
    stream: bool


KINDS = (
    Kind("short", "short requests", stream=False),
    Kind("streams", "3 s streams", stream=True),
)


def auto_lane_doc(
    ports: Ports, keys: Mapping[str, str], limit: int, window_s: int
) -> dict[str, Any]:
    """One mock provider and route; each tenant `lane: auto` with one key whose `secret`
    is the file keys/<tenant>.client (written by the caller)."""

    def tenant(name: str, requests: int) -> dict[str, Any]:
        return {
            "name": name,
            "lane": "auto",
            "rate_limits": {"requests": requests, "per": f"{window_s}s"},
            "keys": [
                {
                    "name": f"{name}-key",
                    "hash": hash_key(keys[name]),
                    "secret": {"file": f"keys/{name}.client"},
                }
            ],
        }

    return {
        "version": 1,
        "sluicegate": ports.sluicegate(),
        "listeners": [{"name": "gateway", "address": "127.0.0.1", "port": ports.listener}],
        "providers": [
            {
                "name": PROVIDER,
                "base_url": f"http://127.0.0.1:{ports.providers[PROVIDER]}/v1",
                "mock": {"models": [MODEL], "ttft_ms": 20, "itl_ms": 5, "output_tokens": 4},
            }
        ],
        "routes": [{"name": "chat", "models": [MODEL], "backends": [{"provider": PROVIDER}]}],
        "tenants": [
            *(tenant(kind.tenant, limit) for kind in KINDS),
            tenant(PROBE, 10**9),
        ],
    }


@dataclass(frozen=True)
class Answer:
    sent_s: float  # since the push began
    status: int  # 0: no answer (the connection failed)
    code: str | None  # a refusal's OpenAI error code
    lane: str  # which lane answered, by its rate-limit headers ("exact", "fast")


def _lane_of(headers: Mapping[str, str]) -> str:
    """The exact lane answers OpenAI's x-ratelimit-*-requests; the fast lane, Envoy's
    draft-03 x-ratelimit-limit (docs/fast-lane.md, "What each lane guarantees")."""
    names = {name.lower() for name in headers}
    if "x-ratelimit-limit-requests" in names:
        return "exact"
    if "x-ratelimit-limit" in names:
        return "fast"
    return "?"


def _post(url: str, key: str, stream: bool, started: float) -> Answer:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={**headers, **(LONG_STREAM if stream else {})},
    )
    sent = time.monotonic() - started
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read()
            whole = text.rstrip().endswith(b"data: [DONE]") if stream else bool(json.loads(text))
            status = response.status if whole else -1  # -1: a 200 cut short
            return Answer(sent, status, None, _lane_of(dict(response.headers)))
    except urllib.error.HTTPError as err:
        return Answer(sent, err.code, error_code(err.read()), _lane_of(dict(err.headers)))
    except (OSError, ValueError):
        return Answer(sent, 0, None, "?")


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@dataclass
class LaneWatch:
    """Polls /status `lanes` for one tenant in a thread: each lane it was seen in, from
    when (seconds since `started`, from the status's `since_s`), and its move count."""

    status_url: str
    tenant: str
    started: float
    seen: list[tuple[float, str]] = field(default_factory=list)
    moves: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def poll(self) -> str:
        state = _json(self.status_url)["lanes"][self.tenant]
        now = time.monotonic() - self.started
        lane = str(state["lane"])
        if not self.seen or self.seen[-1][1] != lane:
            self.seen.append((now - float(state["since_s"]), lane))
        self.moves.append(int(state["moves"]))
        return lane

    def _run(self) -> None:
        while not self._stop.wait(STATUS_POLL_S):
            try:
                self.poll()
            except (OSError, ValueError, KeyError):
                continue

    def __enter__(self) -> LaneWatch:
        self.poll()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def moved_to(self, lane: str, after_s: float) -> float | None:
        """When it entered `lane` first at or after `after_s`."""
        return next((t for t, seen in self.seen[1:] if seen == lane and t >= after_s), None)


@dataclass
class Run:
    kind: Kind
    rate: float
    push_s: float
    answers: list[Answer]
    watch: LaneWatch
    listener_updates: int
    routing_streams: int
    back_wait_s: float  # how long the run waited for the move back


def _stat(stack: UpStack, name: str) -> int:
    stats = _json(f"{stack.admin}/stats?format=json&filter={name}")["stats"]
    return int(next(s["value"] for s in stats if s["name"] == name))


def _routing_streams(stack: UpStack) -> int:
    return _stat(stack, f"cluster.{wire.EXT_PROC_CLUSTER}.upstream_rq_total")


def push(stack: UpStack, kind: Kind, key: str, rate: float, push_s: float, wait_s: float) -> Run:
    """`rate` requests a second for `push_s`, each sent on time; then up to `wait_s` for
    the tenant's move back to the fast lane."""
    listeners = _stat(stack, LDS_UPDATES)
    streams = _routing_streams(stack)
    # Enough threads that no request waits for one: a stream holds its thread ~3 s.
    workers = int(rate * (4 if kind.stream else 1)) + 32
    started = time.monotonic()
    with LaneWatch(stack.http + "/status", kind.tenant, started) as watch:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = []
            for n in range(int(rate * push_s)):
                time.sleep(max(0.0, started + n / rate - time.monotonic()))
                futures.append(pool.submit(_post, stack.url, key, kind.stream, started))
            answers = [future.result() for future in futures]
        waited = time.monotonic()
        deadline = started + push_s + wait_s
        while watch.seen[-1][1] != "fast" and time.monotonic() < deadline:
            time.sleep(STATUS_POLL_S)
        waited = time.monotonic() - waited
    return Run(
        kind,
        rate,
        push_s,
        answers,
        watch,
        _stat(stack, LDS_UPDATES) - listeners,
        _routing_streams(stack) - streams,
        waited,
    )


def most_in_a_window(answers: list[Answer], window_s: float) -> tuple[int, float]:
    """The most requests admitted in any `window_s` (by send time), and when that window
    began."""
    admitted = sorted(a.sent_s for a in answers if a.status == 200)
    best, began = 0, 0.0
    for index, start in enumerate(admitted):
        count = bisect.bisect_left(admitted, start + window_s) - index
        if count > best:
            best, began = count, start
    return best, began


def per_window(run: Run, window_s: int) -> list[int]:
    """Requests admitted in each `window_s` of the push (the last may be shorter)."""
    counts = [0] * math.ceil(run.push_s / window_s)
    for answer in run.answers:
        if answer.status == 200:
            counts[min(int(answer.sent_s // window_s), len(counts) - 1)] += 1
    return counts


def _commit() -> str:
    """HEAD, and whether the tree differs from it (what was measured)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                 cwd=ROOT, check=True, capture_output=True,
                                 text=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit"
    return head + (" with uncommitted changes" if changed.strip() else "")


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _ratio(count: float, limit: int) -> str:
    return (
        f"{count:,.1f} ({count / limit:.2f}x)"
        if count % 1
        else f"{count:,.0f} ({count / limit:.2f}x)"
    )


def run_rows(runs: list[Run], limit: int, window_s: int) -> list[str]:
    """The table: one column per run."""

    def row(label: str, cells: list[str]) -> str:
        return f"| {label} | " + " | ".join(cells) + " |"

    windows = [most_in_a_window(run.answers, window_s) for run in runs]
    statuses = [Counter(a.status for a in run.answers) for run in runs]
    codes = [Counter(a.code for a in run.answers if a.status == 429) for run in runs]
    by_lane = [Counter(a.lane for a in run.answers if a.status == 200) for run in runs]
    to_exact = [run.watch.moved_to("exact", 0.0) for run in runs]
    back = [run.watch.moved_to("fast", run.push_s) for run in runs]
    bound = [limit + run.rate * COUNTED_WITHIN_S for run in runs]
    return [
        "| | " + " | ".join(run.kind.title for run in runs) + " |",
        "|---|" + "---:|" * len(runs),
        row(
            "requests sent",
            [f"{len(run.answers):,} ({run.rate:g}/s for {run.push_s:g} s)" for run in runs],
        ),
        row(
            f"**most admitted in any {window_s} s** (by send time)",
            [f"**{_ratio(most, limit)}**" for most, _ in windows],
        ),
        row("that window began", [f"t = {began:.1f} s" for _, began in windows]),
        row(
            f"admitted per {window_s} s of sending, in turn",
            [", ".join(str(n) for n in per_window(run, window_s)) for run in runs],
        ),
        row(
            f"the bound: limit + rate times {COUNTED_WITHIN_S:g} s",
            [_ratio(b, limit) for b in bound],
        ),
        row("issue 12's aim", [_ratio(AIM * limit, limit) for _ in runs]),
        row(
            "admitted (200): in the fast lane, in the exact lane",
            [
                f"{s[200]:,}: {lanes['fast']:,}, {lanes['exact']:,}"
                + (f", {lanes['?']:,} unknown" if lanes["?"] else "")
                for s, lanes in zip(statuses, by_lane, strict=True)
            ],
        ),
        row(
            "refused (429), by code",
            [
                f"{s[429]:,}" + "".join(f"; {code}: {n:,}" for code, n in sorted(c.items()))
                for s, c in zip(statuses, codes, strict=True)
            ],
        ),
        row(
            "anything else (5xx, a cut stream, no answer)",
            [
                f"{sum(n for status, n in s.items() if status not in (200, 429)):,}"
                + "".join(
                    f"; {status}: {n}"
                    for status, n in sorted(s.items())
                    if status not in (200, 429)
                )
                for s in statuses
            ],
        ),
        row("moved to the exact lane (after the push began)", [_s(t) for t in to_exact]),
        row(
            "moved back to the fast lane (after the push ended)",
            [_s(None if t is None else t - run.push_s) for t, run in zip(back, runs, strict=True)],
        ),
        row(
            "moves during the run", [str(run.watch.moves[-1] - run.watch.moves[0]) for run in runs]
        ),
        row(
            "routing-stage streams opened (exact-lane requests)",
            [f"{run.routing_streams:,}" for run in runs],
        ),
        row(
            f"Envoy listener updates (`{LDS_UPDATES}`)", [str(run.listener_updates) for run in runs]
        ),
    ]


def reading(runs: list[Run], limit: int, window_s: int) -> list[str]:
    lines = []
    for run in runs:
        most, _ = most_in_a_window(run.answers, window_s)
        bound = limit + run.rate * COUNTED_WITHIN_S
        statuses = Counter(a.status for a in run.answers)
        clean = set(statuses) <= {200, 429} and {
            a.code for a in run.answers if a.status == 429
        } <= {"rate_limit_exceeded"}
        back = run.watch.moved_to("fast", run.push_s)
        lines.append(
            f"- {run.kind.title}: at most {most} admitted in any {window_s} s, "
            f"{most / limit:.2f}x the limit: issue 12's aim (≤ {AIM:g}x) "
            f"**{'met' if most <= AIM * limit else 'missed'}**, "
            f"{'within' if most <= bound else 'above'} the documented bound "
            f"({bound:,.1f}); "
            + (
                "every answer a 200 or a 429 `rate_limit_exceeded`, none lost"
                if clean
                else "**some answers were neither a 200 nor a 429 `rate_limit_exceeded`** (table)"
            )
            + "; "
            + (
                f"moved back to the fast lane {back - run.push_s:.1f} s after the push ended"
                if back is not None
                else f"not moved back within {run.back_wait_s:.0f} s after the push ended"
            )
            + "."
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--window-s", type=int, default=60)
    parser.add_argument("--limit", type=int, default=120)
    parser.add_argument("--push-s", type=float, default=150.0)
    args = parser.parse_args(argv)
    command = command_line("benchmarks.auto_lane", argv)
    commit = _commit()
    rate = 3 * args.limit / args.window_s
    began = time.monotonic()
    loads = [os.getloadavg()[0]]
    keys = {
        name: "sk-bench-" + secrets.token_hex(16) for name in (*(k.tenant for k in KINDS), PROBE)
    }
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="sluicegate-auto-lane-") as tmp:
        work = Path(tmp)
        (work / "keys").mkdir()
        for name, key in keys.items():
            (work / "keys" / f"{name}.client").write_text(key)
        ports = Ports.pick([PROVIDER])
        stack = UpStack(work, auto_lane_doc(ports, keys, args.limit, args.window_s))
        try:
            stack.wait_serving(MODEL, probe_headers(keys[PROBE]))
            for kind in KINDS:
                runs.append(
                    push(
                        stack,
                        kind,
                        keys[kind.tenant],
                        rate,
                        args.push_s,
                        args.window_s + HOLD_S + 10,
                    )
                )
                loads.append(os.getloadavg()[0])
            moves = [line.split(": ", 1)[1] for line in stack.log_lines(": auto lane ")]
        finally:
            stack.stop()
    minutes = (time.monotonic() - began) / 60
    lines = [
        f"`{command}` — {today()}, sluicegate at {commit}; {machine()}; load average (1 min) "
        f"at the start and after each run: {', '.join(f'{x:.2f}' for x in loads)}; "
        f"whole run {minutes:.1f} min.",
        "",
        "`sluicegate up` (one Envoy worker), one mock provider on one route, `lane: auto`",
        f"tenants limited to {args.limit} requests per {args.window_s} s "
        f"(`admission.auto_lane` defaults: exact_above 0.5, fast_below 0.25, hold "
        f"{HOLD_S:g} s), one tenant per run. The client sends three times the limit, "
        f"{rate:g} requests/s for {args.push_s:g} s, open loop (each request sent on time "
        "whatever the answers take): short non-streamed chat completions (about 40 ms), then "
        "streams of 30 events 100 ms apart (about 3 s). The lane is read from /status every "
        f"{STATUS_POLL_S:g} s (when it moved: from its `since_s`); each admitted answer's lane "
        "from its rate-limit headers (the exact lane's OpenAI names, the fast lane's draft 03). "
        'The bound (docs/fast-lane.md, "The auto lane"): the limit, plus what the fast lane '
        f"admits before the exact lane is charged for it, at most the rate times "
        f"{COUNTED_WITHIN_S:g} s (a request is counted at its end or "
        f"{IN_FLIGHT_FLUSH_MS} ms after it began, its record takes up to {LOG_FLUSH_MS} ms "
        "more).",
        "",
        *run_rows(runs, args.limit, args.window_s),
        "",
        "The control plane's log of the moves:",
        "",
        "```",
        *moves,
        "```",
        "",
        "Reading (printed by the run):",
        *reading(runs, args.limit, args.window_s),
    ]
    record(SECTION, "\n".join(lines), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
