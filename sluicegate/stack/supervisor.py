"""Keeps the child processes `up` started running, and says how each is doing.

A child that exits (a crash, `kill -9`, an OOM kill) is reaped at once (so nothing is
left <defunct>), logged with its exit status (unknown for one adopted from an earlier
`up`, stack/adoption.py: `last_exit` null), and started again after a backoff:
0.1 s for the first restart, doubling for each further crash in a row up to 10 s, back
to 0.1 s once a child has served 30 s. It counts as up again when its port accepts a
connection. A child is never started on an address another process already listens
on: at start `up` refuses, naming that process; on a restart (the old process is gone,
so a listener there is someone else's) the attempt counts as failed and is retried
with the backoff, instead of the child dying with "address in use" while its port,
answering, made it look up. `/status` lists every child (`Supervisor.status`) and
`sluicegate status` exits non-zero while one is not up.

Polling `Popen.poll()` every 100 ms costs a few waitpid calls; no Python runs on a
request's path for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from sluicegate.stack.address_holder import in_use_message
from sluicegate.stack.adoption import AdoptedProcess, Recorded, adopt
from sluicegate.stack.children import ProcessHandle, accepts, spawn, stop, wait_listening

log = logging.getLogger("sluicegate.up")

State = Literal["up", "down", "starting"]
BACKOFF_FIRST_S: Final = 0.1
BACKOFF_MAX_S: Final = 10.0
STABLE_S: Final = 30.0  # a child up this long starts its backoff over
_POLL_S: Final = 0.1
_START_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True)
class ChildSpec:
    """How to start one child: `kind` and `name` say what it is (for logs and /status),
    `address` where it listens, `log_path` where its output goes (None: to `up`'s own).
    `env` may carry a secret: it is never shown. `matched_env` names the environment
    variables (of `env`, or inherited from `up`'s) that carry its keys: a process
    adopted from an earlier `up` must have been started with the same values."""

    kind: str
    name: str
    address: str
    argv: Sequence[str]
    log_path: Path | None
    env: Mapping[str, str] | None = field(default=None, repr=False)
    matched_env: tuple[str, ...] = ()

    def expected_env(self) -> dict[str, str | None]:
        """The values of `matched_env` this `up` would start the child with."""
        merged = {**os.environ, **(self.env or {})}
        return {name: merged.get(name) for name in self.matched_env}


class Child:
    """One supervised process and what is known about it."""

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.process: ProcessHandle | None = None
        self.state: State = "down"
        self.restarts = 0
        self.crashes_in_row = 0
        self.last_exit: int | None = None
        self.since = time.time()  # when `state` last changed (wall clock, for /status)
        # When it last came up; None while it is not up, so only a crash of a child that
        # served STABLE_S resets the backoff (not one of a child that never started again).
        self._up_at: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def set_state(self, state: State) -> None:
        self.state = state
        self.since = time.time()
        self._up_at = time.monotonic() if state == "up" else None

    def spawn(self) -> None:
        self.process = spawn(self.spec.argv, self.spec.log_path, self.spec.env)
        self.set_state("starting")

    def adopt(self, recorded: Recorded | None) -> bool:
        """Take over the recorded process if it still runs this child's command."""
        process = adopt(recorded, self.spec.argv, self.spec.expected_env())
        if process is None:
            return False
        self.process = process
        self.set_state("starting")
        log.info("%s %s (pid %d) adopted", self.spec.kind, self.spec.name, process.pid)
        return True

    def wait_listening(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Block until the child listens (raises with its log tail if it exits first)."""
        assert self.process is not None
        what = f"{self.spec.kind} {self.spec.name}"
        wait_listening(self.process, self.spec.address, self.spec.log_path, what, timeout_s)
        self.set_state("up")

    def served_long(self) -> bool:
        """Up, and for STABLE_S or longer: its next crash starts the backoff afresh."""
        return self._up_at is not None and time.monotonic() - self._up_at >= STABLE_S

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.spec.kind,
            "name": self.spec.name,
            "address": self.spec.address,
            "pid": None if self.process is None else self.process.pid,
            "state": self.state,
            "since": self.since,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "log": None if self.spec.log_path is None else str(self.spec.log_path),
        }


def start_children(
    specs: Sequence[ChildSpec],
    recorded: Mapping[tuple[str, str], Recorded] | None = None,
    on_started: Callable[[Child], None] = lambda _: None,
) -> list[Child]:
    """Start every child (or adopt the `recorded` process that runs its command), then
    wait until each listens; on any failure stop them all. `on_started` is called as
    soon as each has a process (`up` records it then: were `up` killed while the others
    start, the next `up` still finds it). A child whose address already accepts
    connections is not started: RuntimeError names the process that holds it."""
    children: list[Child] = []
    try:
        for spec in specs:
            child = Child(spec)
            if not child.adopt((recorded or {}).get((spec.kind, spec.name))):
                if accepts(spec.address):
                    raise RuntimeError(in_use_message(f"{spec.kind} {spec.name}", spec.address))
                child.spawn()
            children.append(child)
            on_started(child)
        for child in children:
            child.wait_listening()
    except BaseException:
        stop_children(children)
        raise
    return children


def stop_children(children: Sequence[Child]) -> None:
    """SIGTERM each (last started first), then SIGKILL after a grace; always reaped."""
    for child in reversed(children):
        if child.process is not None:
            stop(child.process)
        child.set_state("down")


def backoff_s(crashes_in_row: int) -> float:
    """The wait before restart number `crashes_in_row` (1 for the first) of a child."""
    return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, crashes_in_row - 1)))


class Supervisor:
    """Restarts the children it is given when they exit; `run()` until cancelled.

    `on_change` is called whenever a child has started anew (`up` records the stack);
    once `stopping` is set, children that exit are left down (they are being stopped).
    """

    def __init__(
        self,
        children: Sequence[Child],
        on_change: Callable[[], None] = lambda: None,
        stopping: asyncio.Event | None = None,
    ) -> None:
        self.children = list(children)
        self.on_change = on_change
        self.stopping = stopping or asyncio.Event()
        self._restarting: dict[int, asyncio.Task[None]] = {}

    def add(self, children: Sequence[Child]) -> None:
        self.children.extend(children)

    def status(self) -> list[dict[str, Any]]:
        return [child.to_dict() for child in self.children]

    async def run(self) -> None:
        try:
            while not self.stopping.is_set():
                for index, child in enumerate(self.children):
                    if index in self._restarting or child.process is None:
                        continue
                    code = child.process.poll()  # reaps an exited child
                    if code is not None:
                        self._restarting[index] = asyncio.create_task(self._restart(index, code))
                await asyncio.sleep(_POLL_S)
        finally:
            for task in self._restarting.values():
                task.cancel()

    async def _restart(self, index: int, code: int) -> None:
        child = self.children[index]
        try:
            child.crashes_in_row = 1 if child.served_long() else child.crashes_in_row + 1
            child.last_exit = None if code == AdoptedProcess.UNKNOWN_EXIT else code
            child.set_state("down")
            delay = backoff_s(child.crashes_in_row)
            status = "unknown" if code == AdoptedProcess.UNKNOWN_EXIT else str(code)
            log.error("%s %s (pid %s) exited with status %s; restarting in %.1f s",
                      child.spec.kind, child.name, child.process and child.process.pid,
                      status, delay)  # fmt: skip
            await asyncio.sleep(delay)
            if self.stopping.is_set():  # `up` stops while we waited: start nothing
                return
            # The old process is gone, so a listener there is another process's: the
            # child would die with "address in use" while the port answered for it.
            # The old process stays reaped: the next poll retries, with the backoff.
            if await asyncio.to_thread(accepts, child.spec.address):
                log.error("%s", in_use_message(f"{child.spec.kind} {child.name}",
                                               child.spec.address))  # fmt: skip
                return
            try:
                child.spawn()
            except OSError as err:
                log.error("cannot start %s %s: %s", child.spec.kind, child.name, err)
                return
            child.restarts += 1
            assert child.process is not None
            try:
                self.on_change()
            except Exception:  # recording the stack must not leave the child `starting`
                log.exception("after starting %s %s", child.spec.kind, child.name)
            deadline = time.monotonic() + _START_TIMEOUT_S
            while child.process.poll() is None and time.monotonic() < deadline:
                if await asyncio.to_thread(accepts, child.spec.address, 0.5):
                    child.set_state("up")
                    log.warning("%s %s restarted (pid %d, restart %d)", child.spec.kind,
                                child.name, child.process.pid, child.restarts)  # fmt: skip
                    return
                await asyncio.sleep(0.05)
            if child.process.poll() is None:  # alive but never listened: start it over
                log.error("%s %s did not listen within %.0f s; killing it", child.spec.kind,
                          child.name, _START_TIMEOUT_S)  # fmt: skip
                child.process.kill()
        finally:
            # The next poll sees an exit (and restarts again) or a running child.
            self._restarting.pop(index, None)
