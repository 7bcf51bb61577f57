"""Real stacks on free ports, started as a user would: `sluicegate up FILE` (control
plane, ext_proc, Envoy with one worker, the mocks and ext_proc replicas the file
declares) and `sluicegate mock-provider` processes of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sluicegate.config import hash_key
from sluicegate.process import die_with_parent
from sluicegate.testing import children_of, cpu_by_role, free_ports
from sluicegate.testing.recorded_stack import stop_recorded_stack

from .processes import stop_tree, wait_listening

ROOT = Path(__file__).resolve().parent.parent.parent
SLUICEGATE = (sys.executable, "-m", "sluicegate")
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Ports:
    """Free ports for one `sluicegate up`: its listener, its four own addresses, and one
    per mock provider, by name."""

    listener: int
    xds: int
    ext_proc: int
    http: int
    admin: int
    providers: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def pick(cls, providers: Sequence[str] = ()) -> Ports:
        listener, xds, ext_proc, http, admin, *mocks = free_ports(5 + len(providers))
        return cls(listener, xds, ext_proc, http, admin, dict(zip(providers, mocks, strict=True)))

    def sluicegate(self) -> dict[str, Any]:
        """The document's `sluicegate:` section."""
        return {
            "xds": f"127.0.0.1:{self.xds}",
            "ext_proc": f"127.0.0.1:{self.ext_proc}",
            "http": f"127.0.0.1:{self.http}",
            "envoy_admin": f"127.0.0.1:{self.admin}",
        }


def addresses() -> dict[str, Any]:
    """A `sluicegate:` section on free ports (the listener's port is the caller's)."""
    xds, ext_proc, http, admin = free_ports(4)
    return Ports(0, xds, ext_proc, http, admin).sluicegate()


def unlimited_tenant(key: str) -> dict[str, Any]:
    """A tenant `bench` whose one key is `key`, with limits that never refuse: what a
    benchmark measures is their cost (a reservation and its charge on every request)."""
    return {
        "name": "bench",
        "rate_limits": {"requests": 10**9, "tokens": 10**12, "per": "1m"},
        "keys": [{"name": "bench-key", "hash": hash_key(key)}],
    }


def probe_headers(key: str) -> dict[str, str]:
    """A client key and the quickest mock answer: for waiting until a stack serves."""
    return {"authorization": f"Bearer {key}", "x-mock-output-tokens": "1", "x-mock-ttft-ms": "0"}


def chat_body(model: str, max_tokens: int | None = 4) -> bytes:
    document: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens is not None:
        document["max_tokens"] = max_tokens
    return json.dumps(document).encode()


class UpStack:
    """`sluicegate up` with one Envoy worker, in `directory`: on the document `doc`
    (written there as sluicegate.yaml) or on an existing `config` file. `launcher` runs
    instead of `python -m sluicegate` (the `up` arguments follow it). `root` is the
    checkout whose sluicegate runs (another commit's tree, for a before/after run):
    `python -m` puts the working directory first on sys.path, ahead of the venv's
    editable install, and `up`'s children inherit the directory and PYTHONPATH."""

    def __init__(
        self,
        directory: Path,
        doc: Mapping[str, Any] | None = None,
        *,
        config: Path | None = None,
        extra: Sequence[str] = (),
        launcher: Sequence[str] = SLUICEGATE,
        log_name: str = "up.log",
        run_dir: Path | None = None,
        root: Path = ROOT,
    ) -> None:
        self.name = directory.name
        self.root = root
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        if doc is not None:
            config = self.dir / "sluicegate.yaml"
            config.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
        else:
            assert config is not None, "a document or a config file"
            doc = yaml.safe_load(config.read_text())
        assert doc is not None
        self.doc = doc
        self.path = config
        listener = doc["listeners"][0]
        self.host, self.port = str(listener["address"]), int(listener["port"])
        self.url = f"http://{self.host}:{self.port}"
        self.admin = "http://" + doc.get("sluicegate", {}).get("envoy_admin", "127.0.0.1:9901")
        self.http = "http://" + doc.get("sluicegate", {}).get("http", "127.0.0.1:9100")
        self.log_path = self.dir / log_name
        self.run_dir = run_dir or self.dir / "run"
        argv = [*launcher, "up", str(config), "--work-dir", str(self.run_dir),
                "--envoy-concurrency", "1", *extra]  # fmt: skip
        with self.log_path.open("wb") as log:  # the child keeps its own copy
            self.process = subprocess.Popen(
                die_with_parent(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=root,
                env=None if root == ROOT else {**os.environ, "PYTHONPATH": str(root)},
            )

    def log_tail(self, size: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-size:]

    def wait_serving(
        self,
        model: str,
        headers: Mapping[str, str],
        timeout_s: float = START_TIMEOUT_S,
        max_tokens: int | None = 4,
    ) -> None:
        """Until a chat completion through the gateway answers 200 (every part is up)."""
        deadline = time.monotonic() + timeout_s
        body = chat_body(model, max_tokens)
        sent = {"content-type": "application/json", **headers}
        last = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sluicegate up ({self.name}) exited:\n{self.log_tail()}")
            request = urllib.request.Request(
                self.url + "/v1/chat/completions", body, sent, method="POST"
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
        """The stack's processes by role: up (`up` itself, the control plane and the main
        ext_proc server: counted together, as when they were one process), replica,
        envoy, mock."""
        found: dict[str, list[int]] = {
            "up": [self.process.pid],
            "envoy": [],
            "mock": [],
            "replica": [],
        }
        main_ext_proc = self.doc.get("sluicegate", {}).get("ext_proc", "127.0.0.1:18001")
        for pid in children_of(self.process.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [part.decode(errors="replace") for part in cmdline]
            if "sluicegate.provider" in words or "mock-provider" in words:
                found["mock"].append(pid)
            elif "control-plane" in words:
                found["up"].append(pid)
            elif "ext-proc" in words:
                main = words[words.index("--address") + 1] == main_ext_proc
                found["up" if main else "replica"].append(pid)
            elif any(Path(word).name == "envoy" for word in words):
                found["envoy"].append(pid)
        return found

    def envoy_pid(self) -> int:
        envoys = self.pids()["envoy"]
        if not envoys:
            raise RuntimeError(f"no Envoy under `up`:\n{self.log_tail()}")
        return envoys[0]

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far, per role (summed over the role's processes)."""
        return cpu_by_role(self.pids())

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

    def stop(self, grace_s: float = 20.0) -> list[int]:
        """Stop `up` and its children; then whatever its work directory's stack.json
        still names (children adopted from a killed `up` are not its by parentage).
        Returns the pids that had to be killed or stopped apart."""
        return stop_tree(self.process, grace_s=grace_s) + stop_recorded_stack(self.run_dir)


def start_stacks(
    work: Path, docs: Mapping[str, Mapping[str, Any]], key: str, model: str
) -> dict[str, UpStack]:
    """Start every stack at once (they boot in parallel), then wait for each."""
    stacks: dict[str, UpStack] = {}
    try:
        for name, doc in docs.items():
            stacks[name] = UpStack(work / name, doc)
        for stack in stacks.values():
            stack.wait_serving(model, probe_headers(key))
    except BaseException:
        for stack in stacks.values():
            stack.stop()
        raise
    return stacks


MOCK_PROVIDER = (*SLUICEGATE, "mock-provider")


class MockProvider:
    """`sluicegate mock-provider --port PORT ARGS` (or `command --port PORT ARGS`) in its
    own process (so it can be killed or stopped apart from any stack); its log is
    work/mock-NAME.log."""

    def __init__(
        self,
        name: str,
        port: int,
        work: Path,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        tls: bool = False,
        command: Sequence[str] = MOCK_PROVIDER,
    ) -> None:
        self.name = name
        self.port = port
        self.tls = tls
        self.log_path = work / f"mock-{name}.log"
        argv = [*command, "--port", str(port), *args]
        with self.log_path.open("wb") as log:  # the child keeps its own copy
            self.process = subprocess.Popen(
                die_with_parent(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if env is None else {**os.environ, **env},
            )
        self.killed = False

    @property
    def base(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        try:
            wait_listening(self.port, timeout_s)
        except TimeoutError:
            raise RuntimeError(f"mock {self.name} did not start:\n{self.log_tail()}") from None

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def kill(self) -> None:
        """SIGKILL, like a crash: the kernel closes its sockets, the port refuses."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.killed = True

    def stop(self, grace_s: float = 10.0) -> list[int]:
        return stop_tree(self.process, grace_s=grace_s)
