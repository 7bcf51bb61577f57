"""Benchmark: what a stream costs through `sluicegate up`, before and after its usage is
read by Envoy instead of the Python usage observer (issue 10, part 1).

    python -m benchmarks.stream_cost --before TREE [--after TREE] [--rounds 6] [--streams 1000]

`--before`: a checkout of the old code (`git worktree add /tmp/b-before 949ed20`);
`--after`: this checkout by default (or a copy of a working tree others are editing). For
each tree, two gateways, each `sluicegate up` with one Envoy worker and the mock provider
its file declares (20 output tokens, TTFT 20 ms, ITL 2 ms: about 22 events a stream,
paced so that each is a chunk of its own):

- routing: no tenants: the routing-stage ext_proc only;
- admission: a tenant key, a tokens and a requests limit (memory store, limits that never
  refuse), so every stream's reservation is charged from its usage.

A tree's `up` runs from that tree (UpStack `root`); each arm's check row says what its
processes run and what reads a stream's usage in its Envoy (its config dump).

Per round, the arms in rotated order: wrk (1 thread, 32 connections) sends `--streams`
streamed chat completions that do not ask for usage (no `stream_options`: the OpenAI
SDKs' default), every body different. Measured per arm: streams/s and CPU µs per stream
of each role from /proc (Envoy; ext_proc: `up`, the control plane and the main ext_proc
server; the mock). Before the rounds, one probe stream per arm: the events its client got,
whether a usage event reached the client, and the output tokens its request record counted
(`gen_ai_client_token_usage_total` on `/metrics`); then each role's CPU over 3 s idle.
Everything, wrk included, shares this machine's cores, so the figures to compare are the
ratios within the run.

`--split`: where Envoy's CPU for a stream goes, in this checkout. Static Envoys (one
worker each) from one routing-only translation, one ExtProcServer in a process of its own
and one mock behind all of them, each Envoy with some of the stream usage filters removed
from its listener (benchmarks.latency_metrics `without`); the same wrk streams, the arms in
rotated order each round, Envoy's and the ext_proc server's CPU µs per stream (Envoy's
`downstream_rq_total`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks.admission_stack import counter_delta, metrics
from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.ext_proc_child import ExtProcChild
from benchmarks.harness.results import machine, today
from benchmarks.harness.stack import (
    ROOT,
    MockProvider,
    UpStack,
    addresses,
    probe_headers,
    unlimited_tenant,
)
from benchmarks.harness.stats import median
from benchmarks.harness.wrk_cycle import Shape, json_body, run_cycle, write_cycle_script
from benchmarks.latency_metrics import gateway_model, serve_ext_proc, without
from sluicegate.envoy import EnvoyProcess
from sluicegate.testing import cpu_by_role, free_ports, static_bootstrap
from sluicegate.xds.translate import translate
from sluicegate.xds.translate.native import NATIVE_USAGE_READER_FILTER
from sluicegate.xds.translate.stream_usage import SSE_TO_METADATA_FILTER
from sluicegate.xds.translate.usage import STREAM_USAGE_FILTER

KEY: Final = "sk-bench-stream-0123456789abcdef"
MODEL: Final = "chat"
TOKENS: Final = 20
CONNECTIONS: Final = 32
VARIANTS: Final = ("routing", "admission")
ROLES: Final = ("envoy", "ext_proc", "mock")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
TOKENS_OUT: Final = "gen_ai_client_token_usage_total"
REQUESTS: Final = "sluicegate_requests_total"
# Seconds after wrk ends before CPU is read: Envoy flushes its records every 100 ms, and
# decoding them is part of what a stream costs (under load some took most of a second).
SETTLE_S: Final = 1.0
IDLE_S: Final = 3.0
STREAM_BODY: Final = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about sluice gates, take {n}."}],
    "max_tokens": 64,
    "stream": True,
}


def up_doc(variant: str, ttft_ms: float, itl_ms: float) -> dict[str, Any]:
    listen, mock_port = free_ports(2)
    doc: dict[str, Any] = {
        "version": 1,
        "admission": {"lane": "exact"},  # the routing stage (the default is lane_rules.py's)
        "sluicegate": addresses(),
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listen}],
        "providers": [
            {
                "name": "mock",
                "base_url": f"http://127.0.0.1:{mock_port}/v1",
                "mock": {"ttft_ms": ttft_ms, "itl_ms": itl_ms, "output_tokens": TOKENS},
            }
        ],
        "routes": [{"name": "chat", "models": [MODEL], "backends": [{"provider": "mock"}]}],
    }
    if variant == "admission":
        doc["tenants"] = [unlimited_tenant(KEY)]
    return doc


@dataclass
class Arm:
    tree: str  # "before" or "after"
    variant: str
    stack: UpStack

    @property
    def name(self) -> str:
        return f"{self.tree} {self.variant}"

    def cpu(self) -> dict[str, float]:
        pids = self.stack.pids()
        return cpu_by_role(pids, merge={"up": "ext_proc", "replica": "ext_proc"})


# ----- what each arm really runs ---------------------------------------------------------------


def _python_roots(stack: UpStack) -> set[str]:
    """The working directory of every Python process of the stack (its sluicegate's tree)."""
    pids = stack.pids()
    found = set()
    for pid in [*pids["up"], *pids["replica"], *pids["mock"]]:
        try:
            found.add(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
    return found


def _usage_reader(stack: UpStack) -> str:
    """What reads a stream's usage in the arm's Envoy, from its listeners' config dump (the
    whole dump lists every extension the binary has)."""
    url = stack.admin + "/config_dump?resource=dynamic_listeners"
    with urllib.request.urlopen(url, timeout=10) as response:
        dump = response.read().decode()
    if NATIVE_USAGE_READER_FILTER in dump:
        return "the native usage reader"
    if "envoy.filters.http.sse_to_metadata" in dump:
        return "sse_to_metadata (Envoy)"
    if "sluicegate.usage_observer" in dump:
        return "usage observer (Python)"
    return "nothing"


def _probe_stream(stack: UpStack) -> tuple[int, bool]:
    """One stream as wrk sends it: the events the client got, and whether one carried a
    usage object (the client did not ask for one)."""
    body = json_body(STREAM_BODY).replace("{n}", "probe").encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    request = urllib.request.Request(stack.url + "/v1/chat/completions", body, headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    events = [line for line in text.split("\n") if line.startswith("data:")]
    usage = False
    for event in events:
        payload = event[5:].strip()
        if payload != "[DONE]" and isinstance(json.loads(payload).get("usage"), dict):
            usage = True
    return len(events), usage


@dataclass(frozen=True)
class Check:
    roots: str
    reader: str
    events: int
    usage_seen: bool
    tokens: float  # the output tokens the probe stream's record counted
    idle_ms: dict[str, float]  # CPU ms a second per role with no traffic


def _idle_cpu(arm: Arm) -> dict[str, float]:
    """CPU ms per second each role spends with no traffic (polls, timers): part of every
    round's reading, whatever the number of streams."""
    before, started = arm.cpu(), time.monotonic()
    time.sleep(IDLE_S)
    after, seconds = arm.cpu(), time.monotonic() - started
    return {role: (after[role] - before[role]) / seconds * 1e3 for role in ROLES}


def _records_after(scrape: str, before: Samples, count: int) -> Samples:
    """The metrics once `count` more records than in `before` have been counted (Envoy
    sends them every 100 ms; under load they took up to a second to show), or after 10 s."""
    deadline = time.monotonic() + 10.0
    while True:
        now = metrics(scrape)
        if counter_delta(before, now, REQUESTS, {}) >= count or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def check(arm: Arm) -> Check:
    scrape = arm.stack.http + "/metrics"
    time.sleep(SETTLE_S)  # the records of wait_serving's probes land first
    counted = metrics(scrape)
    events, usage = _probe_stream(arm.stack)
    after = _records_after(scrape, counted, 1)
    tokens = counter_delta(counted, after, TOKENS_OUT, {"token_type": "output"})
    roots = ", ".join(sorted(_python_roots(arm.stack)))
    return Check(roots, _usage_reader(arm.stack), events, usage, tokens, _idle_cpu(arm))


# ----- the measurement -------------------------------------------------------------------------


@dataclass
class Results:
    rate: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu_us: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    failed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    streams: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # records
    completed: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by wrk


def measure(arms: list[Arm], script: Path, rounds: int, streams: int) -> Results:
    results = Results()
    number = 0
    for arm in arms:  # warm every path (pools, caches, the ext_proc connections)
        run_cycle(arm.stack.url, script, 200, first=number, connections=CONNECTIONS)
        number += 200
    for index in range(rounds):
        order = arms[index % len(arms) :] + arms[: index % len(arms)]
        for arm in order:
            scrape = arm.stack.http + "/metrics"
            counted = metrics(scrape)
            before = arm.cpu()
            run = run_cycle(arm.stack.url, script, streams, first=number,
                            connections=CONNECTIONS)  # fmt: skip
            number += streams
            time.sleep(SETTLE_S)
            after = arm.cpu()
            # Streams by the gateway's records: wrk stops at its budget with up to 32 streams
            # in flight, which Envoy served (or cut) and which cost CPU too.
            handled = counter_delta(counted, metrics(scrape), REQUESTS, {})
            results.streams[arm.name] += round(handled)
            results.completed[arm.name] += run.requests
            results.failed[arm.name] += run.requests - run.by_status.get(200, 0)
            results.failed[arm.name] += run.socket_errors
            results.rate[arm.name].append(run.requests / run.seconds)
            for role in ROLES:
                used = after.get(role, 0.0) - before.get(role, 0.0)
                results.cpu_us[arm.name][role].append(used / handled * 1e6)
            cpu = results.cpu_us[arm.name]
            print(
                f"round {index + 1} {arm.name:16s} {run.requests / run.seconds:6.0f} streams/s, "
                f"{handled:.0f} records, CPU µs/stream envoy {cpu['envoy'][-1]:.0f} "
                f"ext_proc {cpu['ext_proc'][-1]:.0f} mock {cpu['mock'][-1]:.0f}, "
                f"statuses {dict(run.by_status)}",
                flush=True,
            )
    return results


# ----- the report ------------------------------------------------------------------------------


def _per_round(results: Results, name: str, figure: str) -> list[float]:
    """An arm's figure per round: streams/s, a role's CPU µs per stream, or "envoy+ext_proc"."""
    if figure == "rate":
        return results.rate[name]
    cpu = results.cpu_us[name]
    if figure == "envoy+ext_proc":
        return [e + x for e, x in zip(cpu["envoy"], cpu["ext_proc"], strict=True)]
    return cpu[figure]


def _ratio(results: Results, figure: str, after: str, before: str) -> str:
    """Median over rounds of after / before (the two ran in the same round)."""
    pairs = zip(
        _per_round(results, after, figure), _per_round(results, before, figure), strict=True
    )
    ratios = [a / b for a, b in pairs if b]
    return f"{median(ratios):.2f}x" if ratios else "—"


def report(results: Results, checks: dict[str, Check], command: str, header: str) -> str:
    names = list(checks)
    described = (__doc__ or "").split("\n\n`--split`")[0].split("\n\n", 2)[2].strip()
    out = [f"`{command}` — {header}", "", described, ""]
    out += [
        "| arm | python processes run from | stream usage read by | events the client got "
        "| usage event seen by the client | output tokens its record counted "
        "| idle CPU ms/s: Envoy | ext_proc | mock |",
        "|---|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for name, found in checks.items():
        idle = " | ".join(f"{found.idle_ms[role]:.1f}" for role in ROLES)
        out.append(
            f"| {name} | {found.roots} | {found.reader} | {found.events} | "
            f"{'yes' if found.usage_seen else 'no'} | {found.tokens:.0f} | {idle} |"
        )
    out += [
        "",
        "| arm | streams (records) | completed (wrk) | not 200 | streams/s (c=32) "
        "| CPU µs/stream: Envoy | ext_proc | mock | Envoy + ext_proc |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        cells = [
            f"{median(_per_round(results, name, figure)):.0f}"
            for figure in ("rate", "envoy", "ext_proc", "mock", "envoy+ext_proc")
        ]
        out.append(
            f"| {name} | {results.streams[name]:,} | {results.completed[name]:,} | "
            f"{results.failed[name]} | {' | '.join(cells)} |"
        )
    out += [
        "",
        "Medians of the rounds. CPU from /proc (10 ms ticks), per stream the gateway's records "
        "counted (`sluicegate_requests_total`), those wrk cut at the end of its budget "
        "included; streams/s: those wrk completed.",
    ]
    if any(name.startswith("before") for name in names):
        out += [
            "",
            "| after / before, per round (median) | streams/s | CPU/stream: Envoy | ext_proc "
            "| Envoy + ext_proc |",
            "|---|---:|---:|---:|---:|",
        ]
        for variant in VARIANTS:
            ratios = [
                _ratio(results, figure, f"after {variant}", f"before {variant}")
                for figure in ("rate", "envoy", "ext_proc", "envoy+ext_proc")
            ]
            out.append(f"| {variant} | {' | '.join(ratios)} |")
    return "\n".join(out)


# ----- --split: where Envoy's CPU for a stream goes --------------------------------------------

SPLIT_DOC: Final = "`--split`" + (__doc__ or "").split("`--split`")[1].strip()
# Each arm: the filters removed from the listener, and whether its access logs go too.
SPLIT: Final = {
    "as translated": ((), False),
    "without the Lua filter": ((STREAM_USAGE_FILTER,), False),
    "without sse_to_metadata": ((SSE_TO_METADATA_FILTER,), False),
    "without both": ((STREAM_USAGE_FILTER, SSE_TO_METADATA_FILTER), False),
    "without both and the access log": ((STREAM_USAGE_FILTER, SSE_TO_METADATA_FILTER), True),
}


def _requests(envoy: EnvoyProcess) -> int:
    """Requests Envoy's listeners received (its admin's own left out)."""
    return sum(
        int(value)
        for name, value in envoy.stats().items()
        if name.startswith("http.")
        and name.endswith(".downstream_rq_total")
        and not name.startswith("http.admin.")
    )


def split(rounds: int, streams: int, ttft_ms: float, itl_ms: float) -> str:
    work = Path(tempfile.mkdtemp(prefix="sluicegate-stream-split-"))
    provider, *ports = free_ports(1 + len(SPLIT))
    mock = MockProvider("mock", provider, work,
                        ["--ttft-ms", f"{ttft_ms:g}", "--itl-ms", f"{itl_ms:g}",
                         "--output-tokens", str(TOKENS)])  # fmt: skip
    body = json_body({**STREAM_BODY, "model": "bench-model"})
    shape = Shape("/v1/chat/completions", {"content-type": "application/json"}, body)
    script = write_cycle_script(work / "streams.lua", [shape])
    port_of = dict(zip(SPLIT, ports, strict=True))
    gateways = {name: gateway_model(work, port, provider) for name, port in port_of.items()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in port_of.items()}
    envoys: dict[str, EnvoyProcess] = {}
    rate: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with ExtProcChild(serve_ext_proc, str(work / f"sluicegate-{ports[0]}.yaml")) as ext_proc:
        try:
            for name, (filters, drop_log) in SPLIT.items():
                resources = without(translate(gateways[name]), filters, drop_access_log=drop_log)
                bootstrap = static_bootstrap(resources, ext_proc_port=ext_proc.port)
                envoy = EnvoyProcess(bootstrap, work_dir=work / f"envoy-{len(envoys)}",
                                     concurrency=1)  # fmt: skip
                envoys[name] = envoy
                envoy.start_blocking()
            mock.wait_ready()
            number = 0
            for url in urls.values():
                run_cycle(url, script, 200, first=number, connections=CONNECTIONS)
                number += 200
            names = list(SPLIT)
            for index in range(rounds):
                for name in names[index % len(names) :] + names[: index % len(names)]:
                    envoy = envoys[name]
                    pids = {"envoy": [envoy.pid or 0], "ext_proc": [ext_proc.pid]}
                    before, received = cpu_by_role(pids), _requests(envoy)
                    run = run_cycle(urls[name], script, streams, first=number,
                                    connections=CONNECTIONS)  # fmt: skip
                    number += streams
                    time.sleep(SETTLE_S)
                    after, handled = cpu_by_role(pids), _requests(envoy) - received
                    rate[name].append(run.requests / run.seconds)
                    for role in ("envoy", "ext_proc"):
                        cpu[name][role].append((after[role] - before[role]) / handled * 1e6)
                    print(
                        f"round {index + 1} {name:34s} {rate[name][-1]:5.0f} streams/s, CPU "
                        f"µs/stream envoy {cpu[name]['envoy'][-1]:.0f} ext_proc "
                        f"{cpu[name]['ext_proc'][-1]:.0f}, statuses {dict(run.by_status)}",
                        flush=True,
                    )
        finally:
            for envoy in envoys.values():
                envoy.stop_blocking()
            mock.stop()
    out = [
        "| Envoy's listener | streams/s | CPU µs/stream: Envoy | Envoy x as translated "
        "| ext_proc |",
        "|---|---:|---:|---:|---:|",
    ]
    base = cpu["as translated"]["envoy"]
    for name in SPLIT:
        envoy_us = cpu[name]["envoy"]
        ratio = median([a / b for a, b in zip(envoy_us, base, strict=True)])
        out.append(
            f"| {name} | {median(rate[name]):.0f} | {median(envoy_us):.0f} | {ratio:.2f}x | "
            f"{median(cpu[name]['ext_proc']):.0f} |"
        )
    out += ["", "Medians of the rounds; the ratio per round, then its median."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--before", type=Path, help="a checkout of the old code")
    parser.add_argument("--after", type=Path, default=ROOT, help="default: this checkout")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--streams", type=int, default=1000, help="per arm and round")
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--split", action="store_true", help="where Envoy's CPU goes")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        parser.error("needs wrk on PATH (Debian: apt-get install wrk)")
    if args.split:
        started = time.monotonic()
        text = split(args.rounds, args.streams, args.ttft_ms, args.itl_ms)
        print(
            f"`{command_line('benchmarks.stream_cost', argv)}` — {today()}; {machine()}; "
            f"whole run {time.monotonic() - started:.0f} s.\n\n{SPLIT_DOC}\n\n{text}"
        )
        return 0
    trees = {"after": args.after.resolve()}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    for root in trees.values():
        if not (root / "sluicegate" / "__init__.py").is_file():
            parser.error(f"{root} is not a sluicegate checkout")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluicegate-streams-") as tmp:
        work = Path(tmp)
        headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
        script = write_cycle_script(
            work / "streams.lua",
            [Shape("/v1/chat/completions", headers, json_body(STREAM_BODY))],
        )
        arms: list[Arm] = []
        try:
            for tree, root in trees.items():  # started together, they boot in parallel
                for variant in VARIANTS:
                    doc = up_doc(variant, args.ttft_ms, args.itl_ms)
                    stack = UpStack(work / f"{tree}-{variant}", doc, root=root)
                    arms.append(Arm(tree, variant, stack))
            for arm in arms:
                arm.stack.wait_serving(MODEL, probe_headers(KEY))
            checks = {arm.name: check(arm) for arm in arms}
            results = measure(arms, script, args.rounds, args.streams)
        finally:
            for arm in arms:
                arm.stack.stop()
    header = (
        f"{today()}; {machine()}; Envoy with 1 worker per gateway, wrk with 1 thread; "
        f"mock TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms, {TOKENS} tokens; "
        f"whole run {time.monotonic() - started:.0f} s."
    )
    text = report(results, checks, command_line("benchmarks.stream_cost", argv), header)
    record("Streams: usage read by Envoy, before and after", text, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
