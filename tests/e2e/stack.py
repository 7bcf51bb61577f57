"""Runs `sluicegate up` as a user would, on free ports, for end-to-end tests."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from sluicegate import wire
from sluicegate.config import hash_key
from sluicegate.testing import alive, children_of, quickstart_on_free_ports
from sluicegate.testing.recorded_stack import stop_recorded_stack
from tests.ports import free_ports


def own_addresses(**extra: Any) -> dict[str, Any]:
    """The `sluicegate:` section with xDS, ext_proc, HTTP and Envoy admin on free ports."""
    ports = iter(free_ports(4))
    names = ("xds", "ext_proc", "http", "envoy_admin")
    return {**{name: f"127.0.0.1:{next(ports)}" for name in names}, **extra}


DEMO_KEY = "sk-sluicegate-demo"  # the quickstart's demo tenant's (examples/quickstart.yaml)


def quickstart_with_envoy_keys(tmp: Path) -> dict[str, Any]:
    """The quickstart on free ports, ready for Envoy's key check (the fast and auto
    lanes): the demo key's `secret` in a file of the test's own, and no concurrency gates
    (an `auto` tenant's requests for a gated model would take the exact lane)."""
    doc = quickstart_on_free_ports(tmp)
    for route in doc["routes"]:
        route.pop("concurrency", None)
    (demo,) = doc["tenants"]
    (tmp / "keys" / "demo.client").write_text(DEMO_KEY)
    demo["keys"][0]["secret"] = {"file": "keys/demo.client"}
    return doc


class Stack:
    """A running `sluicegate up` and the addresses it serves."""

    def __init__(self, config_path: Path, doc: dict[str, Any], process: subprocess.Popen[bytes],
                 log_path: Path) -> None:  # fmt: skip
        self.config_path = config_path
        self.doc = doc
        self.process = process
        self.log_path = log_path
        listener = doc["listeners"][0]
        self.gateway = f"http://{listener['address']}:{listener['port']}"
        self.admin = "http://" + doc["sluicegate"]["envoy_admin"]
        self.status_url = "http://" + doc["sluicegate"]["http"] + "/status"

    def write(self, doc: dict[str, Any]) -> None:
        """Replace the config file atomically, like an editor that renames over it."""
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        os.replace(tmp, self.config_path)
        self.doc = doc

    def write_text(self, text: str) -> None:
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config_path)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.status_url, timeout=5) as response:
            result: dict[str, Any] = json.load(response)
            return result

    def admin_json(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.admin + path, timeout=5) as response:
            result: dict[str, Any] = json.load(response)
            return result

    def metric_sum(self, name: str, **labels: str) -> float:
        """The sum of /metrics samples `name` over the series whose labels include
        `labels`."""
        url = "http://" + self.doc["sluicegate"]["http"] + "/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def routing_stage_streams(self) -> int:
        """Requests Envoy sent to the routing stage's cluster, each one ext_proc stream
        (the fast lane opens none)."""
        stats = self.admin_json("/stats?format=json&filter=upstream_rq_total")["stats"]
        name = f"cluster.{wire.EXT_PROC_CLUSTER}.upstream_rq_total"
        (value,) = [s["value"] for s in stats if s["name"] == name]  # the cluster exists
        return int(value)

    def last_request_to(self, provider: str) -> dict[str, Any]:
        """The last request the mock provider `provider` received, as its /mock/stats
        shows it (credential headers left out)."""
        (found,) = [p for p in self.doc["providers"] if p["name"] == provider]
        url = found["base_url"].removesuffix("/v1") + "/mock/stats"
        with urllib.request.urlopen(url, timeout=5) as response:
            last: dict[str, Any] = json.load(response)["last_request"]
        return last


def keyed_tenant(tmp: Path, name: str, key: str, **extra: Any) -> dict[str, Any]:
    """A tenant `name` whose one key `<name>-key` is `key`, its hash in the config and
    its secret in `tmp`/keys/<name>.client (the fast lane's Envoy checks it itself)."""
    (tmp / "keys").mkdir(exist_ok=True)
    (tmp / "keys" / f"{name}.client").write_text(key + "\n")
    secret = {"file": f"keys/{name}.client"}
    return {
        "name": name,
        "keys": [{"name": f"{name}-key", "hash": hash_key(key), "secret": secret}],
        **extra,
    }


class Answer:
    """A gateway's answer: status, headers and body text."""

    def __init__(self, status: int, headers: Any, text: str) -> None:
        self.status, self.headers, self.text = status, headers, text

    @property
    def error(self) -> dict[str, Any]:
        """Its OpenAI error object (the body must be JSON)."""
        assert self.headers["content-type"].startswith("application/json"), self.text
        error: dict[str, Any] = json.loads(self.text)["error"]
        return error


def post_chat(stack: Stack, body: dict[str, Any], headers: dict[str, str]) -> Answer:
    """POST `body` to the gateway's chat completions, an error answer included."""
    request = urllib.request.Request(
        stack.gateway + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, response.headers, response.read().decode())
    except urllib.error.HTTPError as err:
        return Answer(err.code, err.headers, err.read().decode())


def _wait_serving(stack: Stack, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if stack.process.poll() is not None:
            raise RuntimeError(f"sluicegate up exited early:\n{stack.log()[-4000:]}")
        try:
            with urllib.request.urlopen(stack.gateway + "/v1/models", timeout=2) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as err:
            if err.code == 401:  # tenants exist: ext_proc answered, so all of it is up
                return
            last = err
        except (OSError, urllib.error.URLError) as err:
            last = err
        time.sleep(0.1)
    raise RuntimeError(f"gateway not serving after {timeout_s}s ({last}):\n{stack.log()[-4000:]}")


def start_up(
    config_path: Path, work_dir: Path, log_path: Path, *extra_args: str
) -> subprocess.Popen[bytes]:
    """`sluicegate up` on config_path with one Envoy worker, its output to log_path."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "up", str(config_path),
             "--work-dir", str(work_dir), "--envoy-concurrency", "1", *extra_args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip


@contextmanager
def holding_quickstart_addresses() -> Iterator[None]:
    """Hold the quickstart's documented addresses (examples/quickstart.yaml) for a test
    that binds them: the tests run in two pytest-xdist workers (the Makefile's `-n 2`),
    and two such tests at once would take each other's ports."""
    path = Path(tempfile.gettempdir()) / "sluicegate-tests-quickstart-addresses.lock"
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@contextmanager
def running_stack(tmp: Path, doc: dict[str, Any], *extra_args: str,
                  timeout_s: float = 60.0) -> Iterator[Stack]:  # fmt: skip
    """Start `sluicegate up` on doc; on exit SIGTERM it and check nothing is left running.

    Cleans up through `stack.process`, whichever `up` it is by then (a test may kill
    the first and start another), and also stops every child recorded in the work
    directory's stack.json: adopted children are not the second `up`'s by parentage."""
    config_path = tmp / "sluicegate.yaml"
    config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    log_path = tmp / "up.log"
    work_dir = tmp / "work"
    stack = Stack(config_path, doc, start_up(config_path, work_dir, log_path, *extra_args),
                  log_path)  # fmt: skip
    try:
        _wait_serving(stack, timeout_s)
        yield stack
    finally:
        process = stack.process
        children = children_of(process.pid) if process.poll() is None else []
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            for pid in children:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            stop_recorded_stack(work_dir)
            raise AssertionError(f"sluicegate up ignored SIGTERM:\n{stack.log()[-3000:]}") from None
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in children if alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        left += stop_recorded_stack(work_dir)
        assert not left, f"processes left running after SIGTERM: {left}"
