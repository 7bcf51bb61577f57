"""Benchmark: what clients see when one of the gateway's own processes is killed under load.

Not collected by pytest. Run from the repository root (venv active, Envoy on PATH):

    python -m benchmarks.faults            # prints the table
    python -m benchmarks.faults --write    # and records it in RESULTS.md ("Process faults")

Options: --clients N (default 8), --rounds N (kills of each process, default 2).

Two real stacks, each `sluicegate up` with one Envoy worker on the quickstart (its two
mock providers, on free ports) plus one ext_proc replica, the tenant's request limit
lifted so that only faults fail requests:

- memory store: kill -9 the ext_proc replica, the main ext_proc server, the control
  plane, the mock provider `alpha`, then `up` itself (a new `up` on the same work
  directory adopts its children: back is when its `/status` shows every process up);
- Redis store (`admission.store.kind: redis`, `on_failure: local`, a redis-server this
  script runs): kill -9 Redis, which this script starts again on the same port at once
  (Redis is not a child of `up`; its own supervisor would).

N closed-loop clients (one keep-alive connection each) send chat completions for
`gpt-4o-mini` (alpha and beta, 3:1; 2 output tokens, TTFT 20 ms) throughout. Each kill
comes after 3 s of load and the load goes on until 8 s after it. Every request's outcome
is sorted by when it started: before the kill and still in flight, within 2 s after it,
or later (the aim: none of those fails). "Back" is when `/status` shows the process up
again with a new pid (Redis: when it answers PING again). "Defunct" counts unreaped
children of `up` after each round.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness.cli import benchmark_parser, command_line, record
from benchmarks.harness.results import machine, today
from benchmarks.harness.stack import UpStack, probe_headers
from sluicegate.testing import (
    SETTLED_S,
    RedisServer,
    Verdict,
    free_port,
    judge,
    quickstart_on_free_ports,
    steady_load,
    wait_until,
)

SECTION = "Process faults"
KEY = "sk-sluicegate-demo"
MODEL = "gpt-4o-mini"
HEADERS = {"authorization": f"Bearer {KEY}", "x-mock-output-tokens": "2", "x-mock-ttft-ms": "20"}
WARM_S = 3.0
AFTER_S = 8.0


def fault_doc(tmp: Path, redis_url: str | None) -> dict[str, Any]:
    doc = quickstart_on_free_ports(tmp)
    doc["sluicegate"]["ext_proc_replicas"] = [f"127.0.0.1:{free_port()}"]
    for tenant in doc["tenants"]:
        # A limit every request is checked against (so the store is on the path), never hit.
        tenant["rate_limits"] = {"requests": 10_000_000, "per": "1m"}
    if redis_url is not None:
        doc["admission"]["store"] = {"kind": "redis", "url": redis_url, "on_failure": "local"}
    return doc


def status(stack: UpStack) -> dict[str, Any]:
    with urllib.request.urlopen(stack.http + "/status", timeout=5) as response:
        document: dict[str, Any] = json.load(response)
        return document


def process(stack: UpStack, kind: str, name: str) -> dict[str, Any]:
    processes: list[dict[str, Any]] = status(stack)["processes"]
    (found,) = [p for p in processes if (p["kind"], p["name"]) == (kind, name)]
    return found


Kill = tuple[Callable[[], float], Callable[[], bool]]  # SIGKILL (returns when), and back?


def defunct_children(pid: int) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            count += fields[0] == "Z" and int(fields[1]) == pid
    return count


def one_kill(stack: UpStack, what: str, fault: Kill, clients: int) -> tuple[Verdict, int]:
    kill, back = fault
    with steady_load(stack.url, MODEL, HEADERS, clients) as load:
        time.sleep(WARM_S)
        killed_at = kill()
        came_back = wait_until(back, 30, poll_s=0.02)
        back_after = time.monotonic() - killed_at if came_back else None
        wait_until(lambda: time.monotonic() >= killed_at + AFTER_S, AFTER_S + 1)
    verdict = judge(what, load.since(0), killed_at, back_after)
    defunct = defunct_children(stack.process.pid) if stack.process.poll() is None else 0
    print(verdict, f"defunct={defunct}", flush=True)
    return verdict, defunct


def kill_child(stack: UpStack, kind: str, name: str) -> Kill:
    """SIGKILL for a child of `up` (returns when it was sent), and whether it is back."""
    pid = process(stack, kind, name)["pid"]

    def kill() -> float:
        os.kill(pid, signal.SIGKILL)
        return time.monotonic()

    def back() -> bool:
        now = process(stack, kind, name)
        return bool(now["state"] == "up" and now["pid"] != pid)

    return kill, back


class UpKill:
    """kill -9 `up` itself, then start another `up` on the same config and work
    directory, which adopts the children; back when its /status shows all of them up."""

    def __init__(self, stack: UpStack, round_index: int) -> None:
        self.old = stack
        self.new: UpStack | None = None
        self.round = round_index

    def kill(self) -> float:
        self.old.process.kill()
        killed_at = time.monotonic()
        self.old.process.wait()
        self.new = UpStack(self.old.dir, config=self.old.path, log_name=f"up-{self.round}.log")
        return killed_at

    def back(self) -> bool:
        if self.new is None:
            return False
        try:
            processes = status(self.new)["processes"]
        except OSError:
            return False
        return all(p["state"] == "up" for p in processes)


def run_stack(
    work: Path, redis_server: RedisServer | None, clients: int, rounds: int
) -> list[tuple[Verdict, int]]:
    doc = fault_doc(work, None if redis_server is None else redis_server.url)
    stack = UpStack(work, doc)  # beside the key files quickstart_on_free_ports copied
    found: list[tuple[Verdict, int]] = []
    try:
        stack.wait_serving(MODEL, probe_headers(KEY))
        for index in range(rounds):
            if redis_server is None:
                (replica,) = doc["sluicegate"]["ext_proc_replicas"]
                for kind, name, label in (
                    ("ext_proc_replica", replica, "an ext_proc replica"),
                    ("ext_proc", "main", "the main ext_proc server"),
                    ("control_plane", "xds", "the control plane"),
                    ("mock_provider", "alpha", "a mock provider (alpha)"),
                ):
                    found.append(one_kill(stack, label, kill_child(stack, kind, name), clients))
                up_kill = UpKill(stack, index + 2)
                found.append(one_kill(stack, "`up` (adopted by a new `up`)",
                                      (up_kill.kill, up_kill.back), clients))  # fmt: skip
                assert up_kill.new is not None
                stack = up_kill.new
            else:
                what = "Redis (restarted by its supervisor at once)"
                found.append(one_kill(stack, what, _kill_redis(redis_server), clients))
    finally:
        stack.stop()
    return found


def _kill_redis(server: RedisServer) -> Kill:
    client = redis.Redis(port=server.port, socket_timeout=0.5)
    pid = int(client.info("server")["process_id"])

    def kill() -> float:
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        server.stop()  # reaps it
        server.start()  # what systemd or Kubernetes would do; waits for PONG
        return killed_at

    def back() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    return kill, back


def report(results: list[tuple[Verdict, int]], clients: int, command: str) -> str:
    lines = [
        f"`{command}` — {today()}; {machine()}.",
        "",
        f"{clients} clients in a closed loop through `sluicegate up` (quickstart, one ext_proc "
        "replica, one Envoy worker); each process killed with SIGKILL after 3 s of load, "
        f"load until 8 s after. A request *in flight* started before the kill; *< {SETTLED_S:g} s*"
        f" started within {SETTLED_S:g} s after it; *later* after that (the aim: 0).",
        "",
        "| killed | requests | failed in flight | failed < 2 s | failed later | back after "
        "| defunct | failures by status and code |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for verdict, defunct in results:
        what, total, in_flight, soon, later, back, codes = verdict.row()
        lines.append(
            f"| {what} | {total} | {in_flight} | {soon} | {later} | {back} | {defunct} | {codes} |"
        )
    later = sum(v.failed_settled for v, _ in results)
    backs = [v.back_after_s for v, _ in results if v.back_after_s is not None]
    lines += [
        "",
        f"Requests failed {SETTLED_S:g} s or more after a kill: {later}. Slowest return: "
        + (f"{max(backs):.2f} s" if len(backs) == len(results) else "some never came back")
        + f"; defunct children: {sum(d for _, d in results)}. A replica is back when its "
        "`sluicegate ext-proc` process has started again (most of it is Python importing "
        "the server); Envoy's TCP health check (every 0.5 s) sends to it again at its next "
        "probe.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    results: list[tuple[Verdict, int]] = []
    with tempfile.TemporaryDirectory(prefix="sluicegate-faults-") as tmp:
        work = Path(tmp)
        results += run_stack(work / "memory", None, args.clients, args.rounds)
        with RedisServer() as server:
            results += run_stack(work / "redis", server, args.clients, args.rounds)
    command = command_line("benchmarks.faults", argv)
    record(SECTION, report(results, args.clients, command), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
