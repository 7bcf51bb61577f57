"""Benchmark: from a YAML change to a real Envoy serving it, and one control
plane holding many simulated Envoys.

Not collected by pytest. Run from the repository root (venv active):

    python -m benchmarks.xds_push            # full run (~4 min on 2 cores), updates RESULTS.md
    python -m benchmarks.xds_push --quick    # smaller run, prints only (add --write to record)

1. Push latency. For N routes (10, 100, 1,000; one model each, backends on two
   mock providers that `up` starts), `sluicegate up FILE --envoy-concurrency 1`
   runs on free ports with a real Envoy. K times per kind, the file is replaced
   atomically (os.replace) by a changed one:
     - "add": one route (a new model `probe-<k>`) is added;
     - "all": every route is renamed (so every cluster, every endpoint
       assignment and every route entry is new, the old ones removed) and one
       `probe-<k>` route is added.
   Measured from os.replace to (a) a chat completion for `probe-<k>` through
   the gateway answering 200 (polled every 5 ms), (b) `/status` showing every
   node ACKed the new versions (polled every 10 ms; the expected versions are
   content hashes, computed in this process beforehand), and (c) `/status`'s
   `last_reload.at`: the file watcher noticed, and the control plane loaded,
   translated and published the file.
   Same-session baselines: N=10 (ratios), and the in-process cost of the
   pipeline the control plane runs on a change (load_config, build_ir +
   translate, Snapshot.from_resources), measured in this process on the same
   files, so the reader sees translation vs transport vs Envoy apply.

2. Holding streams. A control-plane process (an ADS server over a
   SnapshotCache with the 100-route snapshot, nothing else) and two client
   processes with N/2 `AdsClient` streams each (one gRPC connection per
   stream, as N Envoys would have), subscribing like Envoy: wildcard CDS and
   LDS, RDS by name, EDS for the clusters received. Measured: control-plane
   RSS before and after, its CPU seconds until all N held the full config,
   then one change (every route's weights flipped, one route added) → time
   until all N ACKed it (server-side ACK times) and the CPU spent on it, and
   idle CPU while holding them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import (
    cpu_seconds,
    free_ports,
    machine,
    median,
    rss_bytes,
    stop_tree,
    today,
    update_section,
)

SECTION = "xDS push"
#: The push-latency aim from the issue: 1,000 routes live within 1 s of the change.
AIM_S = 1.0
CHAT_POLL_S = 0.005
STATUS_POLL_S = 0.010
#: Bound on waiting for one change to be served / ACKed.
CHANGE_TIMEOUT_S = 30.0
START_TIMEOUT_S = 90.0
CLIENT_KEY = "sk-sluicegate-bench"

TYPE_NAMES = ("Cluster", "ClusterLoadAssignment", "Listener", "RouteConfiguration")


# ----- configs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ports:
    listener: int
    xds: int
    ext_proc: int
    http: int
    admin: int
    alpha: int
    beta: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(*free_ports(7))


def gateway_doc(n: int, ports: Ports, *, generation: int = 0, probes: Sequence[int] = (),
                flip_weights: bool = False) -> dict[str, Any]:  # fmt: skip
    """N routes `r-0000`… (model `m-0000`…), each on both mocks 3:1, plus probe routes.

    `generation` > 0 renames every route (`r-0000-g3`): a whole new route set."""
    suffix = f"-g{generation}" if generation else ""
    alpha_w, beta_w = (1, 3) if flip_weights else (3, 1)
    routes: list[dict[str, Any]] = [
        {
            "name": f"r-{i:04d}{suffix}",
            "models": [f"m-{i:04d}"],
            "backends": [
                {"provider": "alpha", "weight": alpha_w},
                {"provider": "beta", "weight": beta_w},
            ],
        }
        for i in range(n)
    ]
    routes += [
        {"name": f"probe-{k}", "models": [f"probe-{k}"], "backends": [{"provider": "alpha"}]}
        for k in probes
    ]
    mock = {"ttft_ms": 0, "itl_ms": 0, "output_tokens": 1}  # `models` empty: any model
    return {
        "version": 1,
        "sluicegate": {
            "xds": f"127.0.0.1:{ports.xds}",
            "ext_proc": f"127.0.0.1:{ports.ext_proc}",
            "http": f"127.0.0.1:{ports.http}",
            "envoy_admin": f"127.0.0.1:{ports.admin}",
        },
        "listeners": [{"name": "gateway", "address": "127.0.0.1", "port": ports.listener}],
        "providers": [
            {"name": "alpha", "base_url": f"http://127.0.0.1:{ports.alpha}/v1", "mock": mock},
            {"name": "beta", "base_url": f"http://127.0.0.1:{ports.beta}/v1", "mock": mock},
        ],
        "routes": routes,
    }


def dump(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=False)


@dataclass
class Pipeline:
    """The control plane's work on one file, timed in this process (seconds)."""

    load: float  # load_config + resolve_api_keys (YAML parse, schema, cross-checks)
    translate: float  # build_ir + translate
    snapshot: float  # Snapshot.from_resources (serialize + hash every resource)
    versions: dict[str, str]


def run_pipeline(path: Path) -> Pipeline:
    """What ControlPlane.load does with a file (minus publishing), timed."""
    from sluicegate.config import load_config, resolve_api_keys
    from sluicegate.xds.server import Snapshot
    from sluicegate.xds.translate import build_ir, translate

    t0 = time.perf_counter()
    config = load_config(path)
    keys = resolve_api_keys(config, path)
    t1 = time.perf_counter()
    resources = translate(build_ir(config, keys))
    t2 = time.perf_counter()
    snapshot = Snapshot.from_resources(resources)
    t3 = time.perf_counter()
    return Pipeline(t1 - t0, t2 - t1, t3 - t2, snapshot.versions())


def yaml_parse_seconds(text: str) -> tuple[float, float]:
    """(sluicegate's parse_yaml, PyYAML's libyaml CSafeLoader compose+construct) on `text`:
    where load_config's time goes, and what a C parser would cost instead."""
    from sluicegate.config.source import parse_yaml

    t0 = time.perf_counter()
    parse_yaml(text, "bench.yaml")
    t1 = time.perf_counter()
    c_loader = getattr(yaml, "CSafeLoader", None)
    if c_loader is None:
        return t1 - t0, float("nan")
    loader = c_loader(text)
    try:
        node = loader.get_single_node()
        loader.construct_document(node)
    finally:
        loader.dispose()
    return t1 - t0, time.perf_counter() - t1


# ----- part 1: YAML change → Envoy serving it -----------------------------------------------


@dataclass
class Change:
    kind: str  # "add" | "all"
    served_s: float | None  # os.replace → 200 for the probe model
    acked_s: float | None  # os.replace → /status: every node ACKed the new versions
    reloaded_s: float | None  # os.replace → last_reload.at (watcher + load + translate)
    pipeline: Pipeline
    unacked: list[str] = field(default_factory=list)  # types never ACKed, if any


@dataclass
class PushRun:
    n: int
    start_s: float  # process start → gateway serving the N routes
    changes: list[Change]
    up_rss: int  # `up` process RSS at the end
    left_running: list[int]
    yaml_parse: list[tuple[float, float]]


class Gateway:
    """A running `sluicegate up` on free ports."""

    def __init__(self, work: Path, doc: dict[str, Any], ads_mode: str) -> None:
        self.work = work
        self.path = work / "sluicegate.yaml"
        self.path.write_text(dump(doc))
        listener = doc["listeners"][0]
        self.host, self.port = str(listener["address"]), int(listener["port"])
        self.status_url = "http://" + doc["sluicegate"]["http"] + "/status"
        self.log_path = work / "up.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sluicegate", "up", str(self.path),
                 "--work-dir", str(work / "run"), "--envoy-concurrency", "1",
                 "--ads-mode", ads_mode],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.status_url, timeout=5) as response:
            result: dict[str, Any] = json.load(response)
            return result

    def wait_serving(self, model: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        if chat_poll(self.host, self.port, model, deadline, self) is None:
            raise RuntimeError(f"gateway never served {model}:\n{self.log_tail()}")

    def replace(self, text: str) -> tuple[float, float]:
        """Write the new file next to the old one, then rename over it (atomic).
        Returns (monotonic, wall) times of the rename."""
        tmp = self.path.with_name("next.yaml")
        tmp.write_text(text)
        return self.replace_prepared(tmp)

    def replace_prepared(self, tmp: Path) -> tuple[float, float]:
        wall = time.time()
        mono = time.monotonic()
        os.replace(tmp, self.path)
        return mono, wall


def chat_poll(host: str, port: int, model: str, deadline: float,
              gateway: Gateway | None = None) -> float | None:  # fmt: skip
    """POST a tiny chat completion every CHAT_POLL_S until one answers 200;
    returns the monotonic time of that answer (None at the deadline)."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ).encode()
    headers = {
        "content-type": "application/json",
        "authorization": f"Bearer {CLIENT_KEY}",
        "x-mock-output-tokens": "1",
        "x-mock-ttft-ms": "0",
    }
    conn: http.client.HTTPConnection | None = None
    try:
        while time.monotonic() < deadline:
            if gateway is not None and gateway.process.poll() is not None:
                raise RuntimeError(f"sluicegate up exited:\n{gateway.log_tail()}")
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, port, timeout=5)
                conn.request("POST", "/v1/chat/completions", body, headers)
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    return time.monotonic()
                if response.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
            time.sleep(CHAT_POLL_S)
        return None
    finally:
        if conn is not None:
            conn.close()


def all_acked(status: Mapping[str, Any], expected: Mapping[str, str]) -> list[str]:
    """Types (short names) not yet ACKed at `expected` by every node; [] when done."""
    nodes = status.get("nodes") or []
    if not nodes:
        return ["no node connected"]
    missing: set[str] = set()
    for node in nodes:
        acked = node.get("acked", {})
        for type_url, version in expected.items():
            if acked.get(type_url) != version:
                missing.add(type_url.rsplit(".", 1)[-1])
    return sorted(missing)


class StatusPoller(threading.Thread):
    """Polls /status until every node ACKed `expected`; records the time."""

    def __init__(self, gateway: Gateway, expected: Mapping[str, str], deadline: float) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.expected = dict(expected)
        self.deadline = deadline
        self.done_at: float | None = None
        self.last_status: dict[str, Any] = {}
        self.missing: list[str] = []
        self.go = threading.Event()

    def run(self) -> None:
        self.go.wait(CHANGE_TIMEOUT_S)
        while time.monotonic() < self.deadline:
            try:
                status = self.gateway.status()
            except (OSError, urllib.error.URLError, ValueError):
                time.sleep(STATUS_POLL_S)
                continue
            self.last_status = status
            self.missing = all_acked(status, self.expected)
            if status.get("versions") == self.expected and not self.missing:
                self.done_at = time.monotonic()
                return
            time.sleep(STATUS_POLL_S)


def measure_change(gateway: Gateway, kind: str, doc: dict[str, Any], model: str) -> Change:
    tmp = gateway.path.with_name("next.yaml")
    tmp.write_text(dump(doc))
    pipeline = run_pipeline(tmp)  # also gives the versions the control plane will publish
    time.sleep(0.25)  # let this process's work settle before the clock starts
    poller = StatusPoller(gateway, pipeline.versions, time.monotonic() + CHANGE_TIMEOUT_S)
    poller.start()
    t0, wall0 = gateway.replace_prepared(tmp)
    poller.go.set()
    served = chat_poll(gateway.host, gateway.port, model, t0 + CHANGE_TIMEOUT_S, gateway)
    poller.join(CHANGE_TIMEOUT_S + 5)
    reloaded: float | None = None
    last_reload = poller.last_status.get("last_reload") or {}
    if last_reload.get("ok") and float(last_reload.get("at", 0)) >= wall0:
        reloaded = float(last_reload["at"]) - wall0
    return Change(
        kind=kind,
        served_s=None if served is None else served - t0,
        acked_s=None if poller.done_at is None else poller.done_at - t0,
        reloaded_s=reloaded,
        pipeline=pipeline,
        unacked=[] if poller.done_at is not None else poller.missing,
    )


def push_latency(n: int, reps: int, work: Path, ads_mode: str) -> PushRun:
    ports = Ports.pick()
    doc = gateway_doc(n, ports)
    gateway = Gateway(work, doc, ads_mode)
    changes: list[Change] = []
    left: list[int] = []
    up_rss = 0
    parse: list[tuple[float, float]] = []
    try:
        started = time.monotonic()
        gateway.wait_serving(f"m-{n - 1:04d}", START_TIMEOUT_S)
        start_s = time.monotonic() - started
        probes: list[int] = []
        plan = [("add", k) for k in range(1, reps + 1)]
        plan += [("all", k) for k in range(reps + 1, 2 * reps + 1)]
        generation = 0
        for kind, k in plan:
            probes.append(k)
            if kind == "all":
                generation = k
            new = gateway_doc(n, ports, generation=generation, probes=probes)
            change = measure_change(gateway, kind, new, f"probe-{k}")
            changes.append(change)
            if change.served_s is None:
                raise RuntimeError(f"probe-{k} never served:\n{gateway.log_tail()}")
            time.sleep(0.3)
        parse = [yaml_parse_seconds(dump(gateway_doc(n, ports))) for _ in range(3)]
        up_rss = rss_bytes(gateway.process.pid)
    finally:
        left = stop_tree(gateway.process)
    return PushRun(n, start_s, changes, up_rss, left, parse)


# ----- part 2: one control plane, many ADS streams ------------------------------------------


class Child:
    """A helper process of this benchmark, spoken to in JSON lines over stdin/stdout."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.log_path = log_path

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            with contextlib.suppress(ValueError):
                self._lines.put(json.loads(raw))
        self._lines.put(None)

    def send(self, message: Mapping[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def recv(self, timeout_s: float) -> dict[str, Any]:
        try:
            message = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            message = None
        if message is None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"helper {self.process.args!r} gave no answer:\n{tail}")
        return message

    def stop(self) -> list[int]:
        with contextlib.suppress(OSError, ValueError):
            self.send({"cmd": "quit"})
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(15)
        killed = stop_tree(self.process, grace_s=5)
        self._log.close()
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        return killed


@dataclass
class HoldRun:
    clients: int
    mode: str
    rss_before: int
    rss_after: int
    rss_after_push: int
    connect_cpu_s: float
    full_config_s: float
    push_acked_s: float
    push_acked_client_s: float
    push_cpu_s: float
    idle_cpu_pct: float
    idle_s: float
    client_cpu_s: float
    acked_nodes: int
    left_running: list[int]


def hold_streams(clients: int, delta: bool, routes: int, idle_s: float, work: Path) -> HoldRun:
    me = [sys.executable, "-m", "benchmarks.xds_push"]
    mode = "delta" if delta else "sotw"
    server = Child([*me, "--role", "control-plane", "--routes", str(routes)],
                   work / f"cp-{clients}-{mode}.log")  # fmt: skip
    helpers: list[Child] = []
    left: list[int] = []
    try:
        ready = server.recv(60)
        target = f"127.0.0.1:{ready['port']}"
        processes = 2 if clients >= 2 else 1
        per = [clients // processes + (1 if i < clients % processes else 0)
               for i in range(processes)]  # fmt: skip
        for i, count in enumerate(per):
            argv = [*me, "--role", "clients", "--target", target, "--count", str(count),
                    "--prefix", f"envoy-{i}-", *(["--delta"] if delta else [])]  # fmt: skip
            helpers.append(Child(argv, work / f"clients-{clients}-{mode}-{i}.log"))
        for helper in helpers:
            helper.recv(60)  # imported and ready
        time.sleep(0.5)
        pid = server.process.pid
        rss_before = rss_bytes(pid)
        client_cpu0 = sum(cpu_seconds(h.process.pid) for h in helpers)

        cpu0 = cpu_seconds(pid)
        t0 = time.monotonic()
        for helper in helpers:
            helper.send({"cmd": "connect", "versions": ready["base"], "routes": ready["routes"]})
        full = [helper.recv(180) for helper in helpers]
        if any(f["ok"] != c for f, c in zip(full, per, strict=True)):
            raise RuntimeError(f"not every stream got the config: {full}")
        full_config_s = max(float(f["last"]) for f in full) - t0
        time.sleep(0.5)  # stragglers' ACKs land
        connect_cpu = cpu_seconds(pid) - cpu0
        rss_after = rss_bytes(pid)

        for helper in helpers:
            helper.send({"cmd": "expect", "versions": ready["changed"]})
        cpu1 = cpu_seconds(pid)
        server.send({"cmd": "push"})
        pushed = server.recv(30)
        synced = [helper.recv(180) for helper in helpers]
        if any(s["ok"] != c for s, c in zip(synced, per, strict=True)):
            raise RuntimeError(f"not every stream got the change: {synced}")
        time.sleep(0.5)
        push_cpu = cpu_seconds(pid) - cpu1
        server.send({"cmd": "acked"})
        acked = server.recv(60)
        rss_after_push = rss_bytes(pid)

        cpu2 = cpu_seconds(pid)
        time.sleep(idle_s)
        idle_pct = 100.0 * (cpu_seconds(pid) - cpu2) / idle_s
        client_cpu = sum(cpu_seconds(h.process.pid) for h in helpers) - client_cpu0
        return HoldRun(
            clients=clients,
            mode=mode,
            rss_before=rss_before,
            rss_after=rss_after,
            rss_after_push=rss_after_push,
            connect_cpu_s=connect_cpu,
            full_config_s=full_config_s,
            push_acked_s=float(acked["last_ack_wall"]) - float(pushed["at_wall"]),
            push_acked_client_s=max(float(s["last"]) for s in synced) - float(pushed["at"]),
            push_cpu_s=push_cpu,
            idle_cpu_pct=idle_pct,
            idle_s=idle_s,
            client_cpu_s=client_cpu,
            acked_nodes=int(acked["acked"]),
            left_running=left,
        )
    finally:
        for helper in helpers:
            left += helper.stop()
        left += server.stop()


# --- the control-plane helper process ---


def _emit(message: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _snapshot_of(doc: Mapping[str, Any], work: Path) -> Any:
    from sluicegate.config import load_config, resolve_api_keys
    from sluicegate.xds.server import Snapshot
    from sluicegate.xds.translate import build_ir, translate

    path = work / "cp.yaml"
    path.write_text(dump(doc))
    config = load_config(path)
    return Snapshot.from_resources(translate(build_ir(config, resolve_api_keys(config, path))))


async def _control_plane(routes: int) -> None:
    from sluicegate.xds.server import ROUTE, SnapshotCache, bound_port, serve_ads

    # Addresses in the config only; no traffic goes to them.
    ports = Ports(10000, 18000, 18001, 9100, 9901, 18081, 18082)
    with tempfile.TemporaryDirectory(prefix="xds-push-cp-") as tmp:
        base = _snapshot_of(gateway_doc(routes, ports), Path(tmp))
        changed = _snapshot_of(gateway_doc(routes, ports, probes=[1], flip_weights=True),
                               Path(tmp))  # fmt: skip
    cache = SnapshotCache()
    cache.set_snapshot(base)
    server = await serve_ads(cache, "127.0.0.1:0")
    _emit({"event": "ready", "port": bound_port(server), "base": base.versions(),
           "changed": changed.versions(), "routes": base.names(ROUTE)})  # fmt: skip
    pushed_at = 0.0
    try:
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)["cmd"]
            if command == "push":
                pushed_at = time.time()
                at = time.monotonic()
                cache.set_snapshot(changed)
                _emit({"event": "pushed", "at": at, "at_wall": pushed_at})
            elif command == "acked":
                nodes = cache.status()
                versions = changed.versions()
                done = [n for n in nodes if n.acked_versions() == versions]
                last = max(
                    (t.acked_at or 0.0 for n in done for t in n.types.values()), default=0.0
                )
                _emit({"event": "acked", "nodes": len(nodes), "acked": len(done),
                       "streams": cache.stream_count(), "last_ack_wall": last})  # fmt: skip
            elif command == "quit":
                break
    finally:
        await server.stop(1.0)


# --- the client helper process ---


async def _follow_endpoints(client: Any, delta: bool) -> None:
    """Like Envoy: subscribe to the endpoints of the clusters the client holds."""
    from sluicegate.xds.server import CLUSTER, ENDPOINT

    def clusters() -> set[str]:
        return set(client.resources.get(CLUSTER, {}))

    def out_of_date() -> bool:
        held = client.resources.get(CLUSTER)
        return held is not None and set(held) != set(client.subscriptions.get(ENDPOINT, ()))

    for _ in range(100_000):  # one step per CDS change; ends when cancelled
        try:
            await client.wait_for(out_of_date, timeout=3600)
        except TimeoutError:
            continue
        wanted = clusters()
        current = set(client.subscriptions.get(ENDPOINT, ()))
        if delta:
            if wanted - current:
                await client.subscribe(ENDPOINT, sorted(wanted - current))
            if current - wanted:
                await client.unsubscribe(ENDPOINT, sorted(current - wanted))
        else:
            await client.subscribe(ENDPOINT, sorted(wanted))


async def _clients(target: str, count: int, prefix: str, delta: bool) -> None:
    from sluicegate.xds.server import CLUSTER, LISTENER, ROUTE, AdsClient

    clients = [AdsClient(target, f"{prefix}{i:04d}", delta=delta) for i in range(count)]
    followers: list[asyncio.Task[None]] = []

    async def start(client: AdsClient, routes: list[str]) -> None:
        await client.connect()
        followers.append(asyncio.create_task(_follow_endpoints(client, delta)))
        await client.subscribe(CLUSTER)
        await client.subscribe(LISTENER)
        await client.subscribe(ROUTE, routes)

    async def synced(client: AdsClient, versions: Mapping[str, str]) -> float:
        def has() -> bool:
            return all(client.versions.get(t) == v for t, v in versions.items())

        await client.wait_for(has, timeout=170)
        return max(r.at for r in client.received)

    async def all_synced(versions: Mapping[str, str]) -> dict[str, Any]:
        results = await asyncio.gather(*(synced(c, versions) for c in clients),
                                       return_exceptions=True)  # fmt: skip
        times = [r for r in results if isinstance(r, float)]
        errors = [repr(r) for r in results if not isinstance(r, float)]
        return {"ok": len(times), "last": max(times, default=0.0),
                "first": min(times, default=0.0), "errors": errors[:3]}  # fmt: skip

    _emit({"event": "ready"})
    try:
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                break
            message = json.loads(line)
            if message["cmd"] == "connect":
                await asyncio.gather(*(start(c, message["routes"]) for c in clients))
                _emit({"event": "full", **await all_synced(message["versions"])})
            elif message["cmd"] == "expect":
                _emit({"event": "synced", **await all_synced(message["versions"])})
            elif message["cmd"] == "quit":
                break
    finally:
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def _run_helper(args: argparse.Namespace) -> None:
    import uvloop  # what `sluicegate up` runs on

    if args.role == "control-plane":
        uvloop.run(_control_plane(args.routes))
    else:
        uvloop.run(_clients(args.target, args.count, args.prefix, args.delta))


# ----- report ------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:.0f}"


def _mb(value: int) -> str:
    return f"{value / 1e6:.0f}"


def _stat(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    present = [v for v in values if v is not None]
    if len(present) < len(values) or not present:
        return None, None
    return median(present), max(present)


def push_table(runs: Sequence[PushRun]) -> list[str]:
    baseline: dict[str, float] = {}
    for kind in ("add", "all"):
        base_runs = [r for r in runs if r.n == runs[0].n]
        served = [c.served_s for r in base_runs for c in r.changes if c.kind == kind]
        med, _ = _stat(served)
        if med:
            baseline[kind] = med
    lines = [
        "| routes | change | served: median / max (ms) | × N=" + str(runs[0].n)
        + " | all nodes ACKed: median / max (ms) | reloaded (ms) | in-process: load / "
        "translate / snapshot (ms) |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for run in runs:
        for kind in ("add", "all"):
            changes = [c for c in run.changes if c.kind == kind]
            if not changes:
                continue
            s_med, s_max = _stat([c.served_s for c in changes])
            a_med, a_max = _stat([c.acked_s for c in changes])
            r_med, _ = _stat([c.reloaded_s for c in changes])
            ratio = "—" if s_med is None or kind not in baseline else f"{s_med / baseline[kind]:.1f}"
            acked = f"{_ms(a_med)} / {_ms(a_max)}"
            if a_med is None:
                missing = sorted({t for c in changes for t in c.unacked})
                acked = "never: " + ", ".join(missing) if missing else "—"
            pipe = (
                f"{_ms(median([c.pipeline.load for c in changes]))} / "
                f"{_ms(median([c.pipeline.translate for c in changes]))} / "
                f"{_ms(median([c.pipeline.snapshot for c in changes]))}"
            )
            label = "1 route added" if kind == "add" else f"all {run.n} renamed + 1 added"
            lines.append(
                f"| {run.n} | {label} | {_ms(s_med)} / {_ms(s_max)} | {ratio} | {acked} "
                f"| {_ms(r_med)} | {pipe} |"
            )
    return lines


def startup_table(runs: Sequence[PushRun]) -> list[str]:
    lines = [
        "| routes | `up` start → serving (s) | `up` RSS (MB) | YAML parse: PyYAML (pure) /"
        " libyaml CSafeLoader (ms) |",
        "|---:|---:|---:|---:|",
    ]
    for run in runs:
        py = median([p for p, _ in run.yaml_parse])
        c = median([q for _, q in run.yaml_parse])
        lines.append(f"| {run.n} | {run.start_s:.1f} | {_mb(run.up_rss)} | "
                     f"{_ms(py)} / {_ms(c)} |")  # fmt: skip
    return lines


def hold_table(runs: Sequence[HoldRun]) -> list[str]:
    lines = [
        "| streams | mode | RSS before → after (MB) | per stream (KB) | CPU to serve all (s)"
        " | all hold full config (s) | change: all ACKed (ms) | CPU for change (s) | "
        f"idle CPU over {runs[0].idle_s:.0f} s | client CPU (s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        per_stream = (run.rss_after - run.rss_before) / run.clients / 1024
        lines.append(
            f"| {run.clients} | {run.mode} | {_mb(run.rss_before)} → {_mb(run.rss_after)} "
            f"| {per_stream:.0f} | {run.connect_cpu_s:.2f} | {run.full_config_s:.2f} "
            f"| {_ms(run.push_acked_s)} | {run.push_cpu_s:.2f} | {run.idle_cpu_pct:.1f} % "
            f"| {run.client_cpu_s:.1f} |"
        )
    return lines


# ----- main --------------------------------------------------------------------------------


@contextlib.contextmanager
def work_dir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="xds-push-"))
    try:
        yield path
    finally:
        if keep:
            print(f"logs kept in {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="N ≤ 100, fewer repetitions")
    parser.add_argument("--write", action="store_true", help="update RESULTS.md (--quick too)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--reps", type=int, help="changes per kind (default 5, quick 2)")
    parser.add_argument("--ads-mode", choices=["sotw", "delta"], default="sotw")
    parser.add_argument("--skip-push", action="store_true")
    parser.add_argument("--skip-streams", action="store_true")
    parser.add_argument("--keep-logs", action="store_true")
    # helper processes of part 2
    parser.add_argument("--role", choices=["control-plane", "clients"], help=argparse.SUPPRESS)
    parser.add_argument("--routes", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="envoy-", help=argparse.SUPPRESS)
    parser.add_argument("--delta", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is not None:
        _run_helper(args)
        return 0

    sizes = (10, 100) if args.quick else (10, 100, 1000)
    reps = args.reps or (2 if args.quick else 5)
    holds = [(100, False), (100, True)] if args.quick else [(100, False), (1000, False),
                                                           (1000, True)]  # fmt: skip
    idle_s = 3.0 if args.quick else 10.0
    command = "python -m benchmarks.xds_push" + (" --quick" if args.quick else "")
    started = time.monotonic()
    push_runs: list[PushRun] = []
    hold_runs: list[HoldRun] = []
    with work_dir(args.keep_logs) as work:
        if not args.skip_push:
            for n in sizes:
                print(f"push latency: {n} routes, {reps} changes per kind ...", flush=True)
                run_dir = work / f"push-{n}"
                run_dir.mkdir()
                push_runs.append(push_latency(n, reps, run_dir, args.ads_mode))
            print("\n".join(["", *startup_table(push_runs), "", *push_table(push_runs)]))
        if not args.skip_streams:
            for clients, delta in holds:
                print(f"holding {clients} {'delta' if delta else 'sotw'} streams ...", flush=True)
                hold_runs.append(hold_streams(clients, delta, 100, idle_s, work))
            print("\n".join(["", *hold_table(hold_runs)]))
    left = [pid for r in push_runs for pid in r.left_running]
    left += [pid for h in hold_runs for pid in h.left_running]
    elapsed = time.monotonic() - started
    print(f"\ntotal {elapsed:.0f} s; processes that needed SIGKILL: {left or 'none'}")
    if (args.write or not (args.quick or args.no_write)) and push_runs and hold_runs:
        update_section(SECTION, report(command, push_runs, hold_runs, elapsed, args.ads_mode))
        print("updated benchmarks/RESULTS.md")
    return 1 if left else 0


def report(command: str, push_runs: Sequence[PushRun], hold_runs: Sequence[HoldRun],
           elapsed: float, ads_mode: str) -> str:  # fmt: skip
    lines = [
        f"`{command}` — {today()}, {machine()}; Envoy 1.40 (`--envoy-concurrency 1`, "
        f"{ads_mode} ADS); whole run {elapsed:.0f} s. Generated by `benchmarks/xds_push.py`; "
        "the reading below it is written by hand.",
        "",
        "### From a YAML change to a real Envoy serving it",
        "",
        "Time from `os.replace` of the config file to: *served* — a chat completion for the "
        "new model through the gateway answers 200 (polled every 5 ms); *all nodes ACKed* — "
        "`/status` shows every node ACKed the new versions (polled every 10 ms); *reloaded* "
        "— `/status`'s `last_reload.at` (the file watcher noticed, the control plane loaded, "
        "translated and published). *In-process*: the same pipeline on the same file, timed "
        "in the benchmark process (same session, same machine). "
        f"{len(push_runs[0].changes) // 2} changes per kind; ratios against N="
        f"{push_runs[0].n}.",
        "",
        *push_table(push_runs),
        "",
        *startup_table(push_runs),
        "",
        "### One control plane holding many ADS streams",
        "",
        "One control-plane process (ADS server + SnapshotCache with the 100-route snapshot: "
        "101 clusters with their endpoints, 1 listener, 1 route configuration), clients in "
        "2 other processes, one gRPC connection per stream, subscribing like Envoy "
        "(wildcard CDS/LDS, RDS by name, EDS for the clusters held). The change flips every "
        "route's weights and adds one route; *all ACKed* is the last ACK's arrival at the "
        "server after `set_snapshot`. CPU is the control-plane process's only.",
        "",
        *hold_table(hold_runs),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
