"""Real stacks for benchmarks/admission.py: `sluicegate up FILE` (control plane, ext_proc,
Envoy with one worker, the mock providers the file declares, ext_proc replicas) on free
ports, started as a user would, plus the clients and readers the parts share."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks._common import children_of, cpu_seconds, free_ports, stop_tree
from sluicegate.process import die_with_parent

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0


def addresses() -> dict[str, str]:
    xds, ext_proc, http, admin = free_ports(4)
    return {
        "xds": f"127.0.0.1:{xds}",
        "ext_proc": f"127.0.0.1:{ext_proc}",
        "http": f"127.0.0.1:{http}",
        "envoy_admin": f"127.0.0.1:{admin}",
    }


class UpStack:
    """`sluicegate up FILE --envoy-concurrency 1` on the document `doc`."""

    def __init__(self, work: Path, name: str, doc: Mapping[str, Any]) -> None:
        self.name = name
        self.doc = doc
        self.dir = work / name
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "sluicegate.yaml"
        path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
        listener = doc["listeners"][0]
        self.url = f"http://{listener['address']}:{listener['port']}"
        self.admin = "http://" + doc["sluicegate"]["envoy_admin"]
        self.http = "http://" + doc["sluicegate"]["http"]
        self.log_path = self.dir / "up.log"
        argv = [
            sys.executable,
            "-m",
            "sluicegate",
            "up",
            str(path),
            "--work-dir",
            str(self.dir / "run"),
            "--envoy-concurrency",
            "1",
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                die_with_parent(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
            )

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_serving(self, model: str, key: str) -> None:
        """Until a chat completion through the gateway answers 200 (every part is up)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        body = json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        ).encode()
        headers = {
            "content-type": "application/json",
            "authorization": f"Bearer {key}",
            "x-mock-output-tokens": "1",
            "x-mock-ttft-ms": "0",
        }
        last = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sluicegate up ({self.name}) exited:\n{self.log_tail()}")
            request = urllib.request.Request(
                self.url + "/v1/chat/completions", body, headers, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}"
            except OSError as err:
                last = str(err)
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} never served {model} ({last}):\n{self.log_tail()}")

    def pids(self) -> dict[str, list[int]]:
        """The stack's processes by role: up (ext_proc + control plane), envoy, mock, replica."""
        found: dict[str, list[int]] = {
            "up": [self.process.pid],
            "envoy": [],
            "mock": [],
            "replica": [],
        }
        for pid in children_of(self.process.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            text = b" ".join(cmdline)
            if b"sluicegate.provider" in text or b"mock-provider" in text:
                found["mock"].append(pid)
            elif b"ext-proc" in text:
                found["replica"].append(pid)
            elif any(Path(part.decode(errors="replace")).name == "envoy" for part in cmdline):
                found["envoy"].append(pid)
        return found

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far, per role (summed over the role's processes)."""
        totals: dict[str, float] = {}
        for role, pids in self.pids().items():
            total = 0.0
            for pid in pids:
                with contextlib.suppress(OSError):
                    total += cpu_seconds(pid)
            totals[role] = total
        return totals

    def log_lines(self, needle: str) -> list[str]:
        """Lines containing `needle` in every log of the stack (up, replicas, Envoy, mocks)."""
        found = []
        for path in sorted(self.dir.rglob("*.log")):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            found += [
                f"{path.name}: {line.strip()}" for line in text.splitlines() if needle in line
            ]
        return found

    def stop(self) -> list[int]:
        return stop_tree(self.process, grace_s=20)


def start_stacks(
    work: Path, docs: Mapping[str, Mapping[str, Any]], key: str, model: str
) -> dict[str, UpStack]:
    """Start every stack at once (they boot in parallel), then wait for each."""
    stacks: dict[str, UpStack] = {}
    try:
        for name, doc in docs.items():
            stacks[name] = UpStack(work, name, doc)
        for stack in stacks.values():
            stack.wait_serving(model, key)
    except BaseException:
        for stack in stacks.values():
            stack.stop()
        raise
    return stacks


# ----- readers ---------------------------------------------------------------------------------


def get_json(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def histogram_delta(
    before: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    after: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    labels: Mapping[str, str],
) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) of a histogram's buckets between two scrapes."""
    buckets = []
    for (sample, sample_labels), value in after.items():
        if sample != f"{name}_bucket":
            continue
        as_dict = dict(sample_labels)
        if any(as_dict.get(k) != v for k, v in labels.items()):
            continue
        le = float(as_dict["le"])
        buckets.append((le, value - before.get((sample, sample_labels), 0.0)))
    return sorted(buckets)


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket the rank falls in."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = upper, count
    return lower


def counter_delta(
    before: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    after: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    labels: Mapping[str, str],
) -> float:
    total = 0.0
    for (sample, sample_labels), value in after.items():
        if sample != name:
            continue
        as_dict = dict(sample_labels)
        if any(as_dict.get(k) != v for k, v in labels.items()):
            continue
        total += value - before.get((sample, sample_labels), 0.0)
    return total


def error_code(raw: bytes) -> str:
    try:
        error = json.loads(raw)["error"]
        return str(error.get("code") or error.get("type"))
    except (ValueError, KeyError, TypeError):
        return "not-json"


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
