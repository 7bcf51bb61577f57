"""Resident memory of every process of a running stack, as its `/status` lists them.

The processes come from `/status` (`processes[].pid`, Envoy included), read again
whenever asked, so a restarted child or a stack that moves its parts into processes of
their own is followed without knowing its layout. Parts sharing one process (the
control plane and the main ext_proc inside `up`) are one row, named by all of them.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

MIB = 1024 * 1024


def status_processes(http: str) -> dict[int, str]:
    """pid -> the parts it runs (`kind name`, joined by ` + `), from `<http>/status`."""
    with urllib.request.urlopen(http + "/status", timeout=5) as response:
        document: dict[str, Any] = json.load(response)
    parts: dict[int, list[str]] = {}
    for process in document.get("processes", []):
        pid = process.get("pid")
        if isinstance(pid, int):
            parts.setdefault(pid, []).append(f"{process['kind']} {process['name']}")
    return {pid: " + ".join(names) for pid, names in parts.items()}


def vm_rss_bytes(pid: int) -> int | None:
    """VmRSS from /proc/<pid>/status; None once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class Sample:
    """RSS of each process at one moment, with the requests the load had completed."""

    at_s: float
    requests: int
    rss: Mapping[str, int]  # process (the parts it runs) -> bytes; pids: pid_changes


@dataclass
class RssSampler:
    """Samples every `every_s` seconds in a thread (and on `sample()`); the pids are
    read from /status at start, on `refresh()`, and when one of them has gone. `also`
    names processes sampled even where /status leaves them out (`up` itself, once it
    only supervises)."""

    http: str
    also: Mapping[int, str] = field(default_factory=dict)
    every_s: float = 2.0
    samples: list[Sample] = field(default_factory=list)
    requests: int = 0  # set by the load as it goes
    pid_changes: list[str] = field(default_factory=list)
    _pids: dict[int, str] = field(default_factory=dict)
    _started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def refresh(self) -> None:
        """Read the pids from /status again; a change is noted in `pid_changes`."""
        pids = {**self.also, **status_processes(self.http)}
        with self._lock:
            if self._pids and pids != self._pids:
                self.pid_changes.append(
                    f"at {time.monotonic() - self._started:.0f} s: {_label(self._pids)} "
                    f"-> {_label(pids)}"
                )
            self._pids = pids

    def sample(self) -> Sample:
        with self._lock:
            pids = dict(self._pids)
        rss: dict[str, int] = {}
        gone = False
        for pid, name in pids.items():
            value = vm_rss_bytes(pid)
            if value is None:
                gone = True
            else:
                rss[name] = value
        if gone:
            self.refresh()
        found = Sample(time.monotonic() - self._started, self.requests, rss)
        with self._lock:
            self.samples.append(found)
        return found

    def __enter__(self) -> RssSampler:
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sample()
            except OSError:
                continue  # /status busy or restarting: the next sample will do


def _label(pids: Mapping[int, str]) -> str:
    return ", ".join(f"{name} {pid}" for pid, name in sorted(pids.items()))
