"""Where the engines run: in this process (`LocalWorkers`), or one per worker process
(`WorkerPool`; a process that may already run an event loop must not fork), each with
its own event loop, its row of shared counters for the progress line, and its samples
sent back through a pipe when a phase ends."""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection as Pipe
from typing import Any, Protocol

from sluicegate.bench.endpoint import Endpoint
from sluicegate.bench.engine import Engine, PhaseResult
from sluicegate.bench.loops import die_with_parent, new_event_loop
from sluicegate.bench.progress import WIDTH, Counters, Numbers
from sluicegate.bench.shapes import WorkerLoad
from sluicegate.bench.spec import BenchSpec

# Loads from which `--processes auto` uses every core: one process sends about 5,000
# non-streamed requests/s (docs/bench.md, "How fast the bench is"); below these it is
# far from its ceiling, and a second process would only take a core from the server.
AUTO_RATE = 1_000.0
AUTO_CONCURRENCY = 64
_START_MARGIN_S = 0.25  # workers start a phase together, this long after it is sent


class BenchError(Exception):
    """The run could not be made (exit 1); never carries a key."""


def auto_processes(spec: BenchSpec) -> int:
    cores = os.cpu_count() or 1
    if cores == 1:
        return 1
    if spec.sweep:
        return cores
    top = max(spec.ramp) if spec.ramp else spec.load
    threshold = AUTO_CONCURRENCY if spec.concurrency is not None else AUTO_RATE
    return cores if top >= threshold else 1


class Workers(Protocol):
    @property
    def counters(self) -> Sequence[Counters]: ...

    @property
    def count(self) -> int: ...

    async def run(self, loads: Sequence[WorkerLoad], duration_s: float | None,
                  warmup_s: float) -> list[PhaseResult]: ...  # fmt: skip

    def close(self) -> None: ...


class LocalWorkers:
    """One engine on the caller's event loop."""

    def __init__(self, spec: BenchSpec, model: str, endpoint: Endpoint) -> None:
        self._engine = Engine(spec, model, endpoint, worker=0)
        self.counters = [self._engine.counters]

    @property
    def count(self) -> int:
        return 1

    async def run(self, loads: Sequence[WorkerLoad], duration_s: float | None,
                  warmup_s: float) -> list[PhaseResult]:  # fmt: skip
        start_at = time.perf_counter()
        return [await self._engine.run(loads[0], start_at, duration_s, warmup_s)]

    def close(self) -> None:
        pass


class WorkerPool:
    """`processes` worker processes, kept for every phase of a run (a sweep's steps).

    Each is `python -m sluicegate.bench.worker_process`, not a multiprocessing child: a
    spawned child imports the caller's main module again, which breaks any script
    without an `if __name__ == "__main__"` guard. The spec (with the key) goes through a
    pipe, never argv or the environment; the counters live in a file both map."""

    def __init__(self, spec: BenchSpec, model: str, endpoint: Endpoint, processes: int) -> None:
        self._file = tempfile.TemporaryFile(prefix="sluicegate-bench-")  # noqa: SIM115 - closed in close()
        self._file.truncate(processes * WIDTH * 8)
        self._map = mmap.mmap(self._file.fileno(), processes * WIDTH * 8)
        shared = memoryview(self._map).cast("d")
        self._shared = shared
        self.counters = [Counters(shared, index * WIDTH) for index in range(processes)]
        self._pipes: list[Pipe] = []
        self._processes: list[subprocess.Popen[bytes]] = []
        self._running = False  # a phase was sent and not all its answers came back
        try:
            for index in range(processes):
                parent, child = multiprocessing.Pipe()
                fds = (child.fileno(), self._file.fileno())
                self._processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "sluicegate.bench.worker_process",
                         str(index), str(fds[0]), str(fds[1])],
                        pass_fds=fds, stdin=subprocess.DEVNULL,
                    )
                )  # fmt: skip
                child.close()
                self._pipes.append(parent)
            for pipe in self._pipes:
                pipe.send(("setup", spec, model, endpoint))
            for pipe in self._pipes:
                self._answer(pipe, "ready")
        except BaseException:
            self.close()
            raise

    @property
    def count(self) -> int:
        return len(self._pipes)

    async def run(self, loads: Sequence[WorkerLoad], duration_s: float | None,
                  warmup_s: float) -> list[PhaseResult]:  # fmt: skip
        start_at = time.perf_counter() + _START_MARGIN_S
        self._running = True
        for pipe, load in zip(self._pipes, loads, strict=True):
            pipe.send(("phase", load, start_at, duration_s, warmup_s))
        loop = asyncio.get_running_loop()
        answers = await asyncio.gather(
            *(loop.run_in_executor(None, self._answer, pipe, "done") for pipe in self._pipes)
        )
        self._running = False
        return [answer[1] for answer in answers]

    def _answer(self, pipe: Pipe, expected: str) -> tuple[Any, ...]:
        try:
            message: tuple[Any, ...] = pipe.recv()
        except (EOFError, OSError):
            raise BenchError("a worker process died") from None
        if message[0] == "error":
            raise BenchError(f"a worker process failed: {message[1]}")
        if message[0] != expected:  # pragma: no cover - the protocol is this file's
            raise BenchError(f"a worker process answered {message[0]!r}")
        return message

    def close(self) -> None:
        """Stop the workers: between phases they are asked to; in the middle of one (the
        run was interrupted or failed) they are terminated."""
        for pipe in self._pipes:
            with contextlib.suppress(OSError, ValueError):
                pipe.send(("stop",))
        for process in self._processes:
            if self._running:
                process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        for pipe in self._pipes:
            pipe.close()
        self._pipes.clear()
        self._processes.clear()
        self.counters = [Counters() for _ in self.counters]  # the map goes: keep no view
        self._shared.release()
        self._map.close()
        self._file.close()


def worker_main(index: int, pipe: Pipe, shared: Numbers) -> None:
    """A worker process: set up its engine, then run each phase it is sent."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        _, spec, model, endpoint = pipe.recv()
        engine = Engine(spec, model, endpoint, worker=index,
                        counters=Counters(shared, index * WIDTH))  # fmt: skip
        pipe.send(("ready",))
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            while True:
                message = pipe.recv()
                if message[0] != "phase":
                    return
                _, load, start_at, duration_s, warmup_s = message
                result = runner.run(engine.run(load, start_at, duration_s, warmup_s))
                pipe.send(("done", result))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    except Exception as err:  # sent to the parent, which reports it
        with contextlib.suppress(Exception):
            pipe.send(("error", f"{type(err).__name__}: {err}"))
