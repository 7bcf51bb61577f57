"""Benchmark: whether the memory of a stack's processes levels off over many requests.

Not collected by pytest. Run from the repository root (venv active, Envoy and wrk on PATH):

    python -m benchmarks.soak            # prints the table
    python -m benchmarks.soak --write    # and records it in RESULTS.md ("Memory soak")

Options: --requests N (after the warm-up, default 200,000), --warm-up N (default 5,000),
--connections N (default 8), --idle S (default 60), --segment N (requests per wrk run,
default 10,000), --samples FILE (every 2 s sample, as JSON).

`sluicegate up` with one Envoy worker on the quickstart (its two mock providers, admission
and its gate on `gpt-4o-mini`, on free ports), two more tenants of two keys each (5 keys
in all), every tenant's and key's limits lifted so that nothing is refused for rate
(the limiter still reserves and reconciles every request). One wrk thread cycles through
a mix of requests: JSON answers and streams with and without
`stream_options.include_usage` (usage read by Envoy, charged from each request's record;
before issue 10, streams' by the Python usage observer) on the three models, from every key,
a few at priority `batch`, and refusals (an unknown key: 401; an unknown model: 404).
Every body differs (a request number in the prompt). The load runs in parts of
--segment requests; each wrk run cut the few requests still in flight when it stopped.

RSS (VmRSS) of every process `/status` lists (processes[].pid, read again after every wrk
run: Envoy included; parts that share a process are one row) and of `up` itself is sampled
every 2 s, and at the warm-up's end, at each quarter of the run, and after --idle seconds
without load. What grows in the ext_proc server and why: RESULTS.md, "Memory soak", and
benchmarks/harness/cancel_leak.py.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.results import machine, today
from benchmarks.harness.rss import MIB, RssSampler, Sample
from benchmarks.harness.stack import UpStack, probe_headers
from benchmarks.harness.wrk_cycle import Shape, WrkRun, json_body, run_cycle, write_cycle_script
from sluicegate.config import hash_key
from sluicegate.testing import quickstart_on_free_ports

SECTION: Final = "Memory soak"
DEMO_KEY: Final = "sk-sluicegate-demo"
MODEL: Final = "gpt-4o-mini"
MODELS: Final = ("gpt-4o-mini", "qwen-plus", "deepseek-chat")
WARM_UP: Final = 5_000
# Far above anything the run can send: every limit is checked and charged, none refuses.
LIFTED: Final = {"requests": 1_000_000_000, "tokens": 1_000_000_000_000, "per": "1m"}
# Fast mock answers: the soak counts requests, not waits (2-4 chunks per stream).
MOCK: Final = {"x-mock-ttft-ms": "0", "x-mock-itl-ms": "0", "x-mock-output-tokens": "3"}
CHAT: Final = "/v1/chat/completions"


def soak_doc(work: Path) -> tuple[dict[str, Any], list[str]]:
    """The quickstart with two more tenants of two keys each, limits lifted; and the
    client keys (the demo key first)."""
    doc = quickstart_on_free_ports(work)
    keys = [DEMO_KEY]
    for tenant in ("team-a", "team-b"):
        entries = []
        for index in (1, 2):
            key = f"sk-soak-{tenant}-{index}"
            keys.append(key)
            entries.append(
                {"name": f"{tenant}-{index}", "hash": hash_key(key), "rate_limits": dict(LIFTED)}
            )
        doc["tenants"].append({"name": tenant, "priority": "standard", "keys": entries})
    # The routing stage, as the soak of record measured it (the quickstart's `lane: auto`
    # would refuse these keys without a secret and limits above Envoy's buckets).
    doc["admission"]["lane"] = "exact"
    for tenant in doc["tenants"]:
        tenant["rate_limits"] = dict(LIFTED)
    return doc, keys


def shapes(keys: list[str]) -> list[Shape]:
    """The request mix: per key, each model as JSON, stream with usage, stream without;
    then a batch request, a bad key and an unknown model."""
    found: list[Shape] = []
    prompt = [{"role": "user", "content": "soak request {n}"}]
    for key in keys:
        headers = {"content-type": "application/json", "authorization": f"Bearer {key}", **MOCK}
        for model in MODELS:
            base: dict[str, Any] = {"model": model, "messages": prompt, "max_tokens": 8}
            found.append(Shape(CHAT, headers, json_body(base)))
            streamed = {**base, "stream": True, "stream_options": {"include_usage": True}}
            found.append(Shape(CHAT, headers, json_body(streamed)))
            found.append(Shape(CHAT, headers, json_body({**base, "stream": True})))
        found.append(
            Shape(
                CHAT,
                {**headers, "x-sluicegate-priority": "batch"},
                json_body({"model": MODEL, "messages": prompt}),
            )
        )
    good = {"content-type": "application/json", "authorization": f"Bearer {keys[0]}", **MOCK}
    bad_key = {**good, "authorization": "Bearer sk-not-a-key-{n}"}
    found.append(Shape(CHAT, bad_key, json_body({"model": MODEL, "messages": prompt})))
    unknown = {"model": "no-such-model-{n}", "messages": prompt}
    found.append(Shape(CHAT, good, json_body(unknown)))
    return found


def metrics_bytes(stack: UpStack) -> int:
    """Size of /metrics: label sets that grew would show here."""
    with urllib.request.urlopen(stack.http + "/metrics", timeout=5) as response:
        return len(response.read())


class Soak:
    """The load, in segments, with the samples taken at its marks."""

    def __init__(self, stack: UpStack, script: Path, sampler: RssSampler, connections: int):
        self.stack = stack
        self.script = script
        self.sampler = sampler
        self.connections = connections
        self.sent = 0
        self.by_status: dict[int, int] = {}
        self.socket_errors = 0
        self.busy_s = 0.0
        self.marks: list[tuple[str, Sample, int]] = []  # label, sample, /metrics bytes

    def send(self, count: int, segment: int) -> None:
        while count > 0:
            budget = min(segment, count)
            run: WrkRun = run_cycle(
                self.stack.url, self.script, budget, first=self.sent, connections=self.connections
            )
            self.sent += run.requests
            self.sampler.requests = self.sent
            count -= run.requests
            self.busy_s += run.seconds
            self.socket_errors += run.socket_errors
            for status, n in run.by_status.items():
                self.by_status[status] = self.by_status.get(status, 0) + n
            self.sampler.refresh()  # a restarted child, a moved part: followed at once
            print(f"{self.sent:>8} requests, {run.requests / run.seconds:6.0f}/s "
                  f"{dict(sorted(run.by_status.items()))}", flush=True)  # fmt: skip

    def mark(self, label: str) -> None:
        self.sampler.refresh()
        sample = self.sampler.sample()
        self.marks.append((label, sample, metrics_bytes(self.stack)))
        rss = ", ".join(f"{k}: {v / MIB:.1f}" for k, v in sorted(sample.rss.items()))
        print(f"[{label}] {rss}", flush=True)


def run(
    work: Path, requests: int, connections: int, idle_s: float, segment: int, warm_up: int
) -> Soak:
    doc, keys = soak_doc(work)
    script = write_cycle_script(work / "soak.lua", shapes(keys))
    stack = UpStack(work, doc)  # beside the key files quickstart_on_free_ports copied
    try:
        stack.wait_serving(MODEL, probe_headers(DEMO_KEY))
        with RssSampler(stack.http, also={stack.process.pid: "sluicegate up"}) as sampler:
            soak = Soak(stack, script, sampler, connections)
            soak.mark("started")
            soak.send(warm_up, segment)
            soak.mark(f"after warm-up ({warm_up:,})")
            quarter = requests // 4
            for index in range(1, 5):
                soak.send(quarter if index < 4 else requests - 3 * quarter, segment)
                soak.mark(f"{soak.sent - warm_up:,}")
            time.sleep(idle_s)
            soak.mark(f"idle {idle_s:g} s")
        return soak
    finally:
        stack.stop()


def report(soak: Soak, command: str, idle_s: float, warm_up: int) -> str:
    names = sorted({name for _, sample, _ in soak.marks for name in sample.rss})
    marks = soak.marks[1:]  # "started" is before any request; shown apart below
    lines = [
        f"`{command}` — {today()}; {machine()}.",
        "",
        f"`sluicegate up` on the quickstart (one Envoy worker, admission and the quickstart's "
        f"gate on), 3 tenants (5 keys), limits lifted; wrk, 1 thread, "
        f"{soak.connections} connections, cycling JSON answers and streams with and "
        "without `include_usage` on 3 models from 5 keys, batch-priority requests, "
        f"401s and 404s; every body different. RSS (VmRSS, MiB) of each process "
        "`/status` lists and of `up`; columns are requests after the warm-up of "
        f"{warm_up:,}, then after {idle_s:g} s without load.",
        "",
        "| process | " + " | ".join(label for label, _, _ in marks) + " |",
        "|---|" + "---:|" * len(marks),
    ]
    for name in names:
        cells = [
            f"{sample.rss[name] / MIB:.1f}" if name in sample.rss else "—" for _, sample, _ in marks
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| `/metrics` size (KiB) | " + " | ".join(
        f"{size / 1024:.1f}" for _, _, size in marks) + " |")  # fmt: skip
    started = soak.marks[0][1]
    statuses = ", ".join(f"{status}: {n:,}" for status, n in sorted(soak.by_status.items()))
    lines += [
        "",
        "Before any request: "
        + ", ".join(f"{k} {v / MIB:.1f}" for k, v in sorted(started.rss.items()))
        + f" MiB. Requests answered: {soak.sent:,} ({statuses}); socket errors "
        f"{soak.socket_errors}; {soak.sent / soak.busy_s:,.0f} requests/s under load. "
        "Process changes seen: " + ("; ".join(soak.sampler.pid_changes) or "none") + ".",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds without load")
    parser.add_argument("--segment", type=int, default=10_000, help="requests per wrk run")
    parser.add_argument(
        "--warm-up", type=int, default=WARM_UP, help="requests before the first mark"
    )
    parser.add_argument("--samples", type=Path, help="write every 2 s sample here (JSON)")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        parser.error("needs wrk on PATH (Debian: apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="sluicegate-soak-") as tmp:
        soak = run(
            Path(tmp), args.requests, args.connections, args.idle, args.segment, args.warm_up
        )
    if args.samples is not None:
        args.samples.write_text(json.dumps([vars(s) for s in soak.sampler.samples], indent=1))
    command = command_line("benchmarks.soak", argv)
    record(SECTION, report(soak, command, args.idle, args.warm_up), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
