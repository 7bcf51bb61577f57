"""One worker's load: sends the requests of a phase (a run, or a sweep step) on its own
event loop and keeps a Sample of each one sent after the warm-up."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from dataclasses import dataclass, field

from sluicegate.bench.endpoint import Endpoint
from sluicegate.bench.http import CONNECTION, TIMEOUT, Connection, Exchange, connect
from sluicegate.bench.mix import Mix, Prepared
from sluicegate.bench.progress import DONE, DROPPED, FAILED, INFLIGHT, SENT, WIDTH, Counters
from sluicegate.bench.samples import OK, Sample, failed_sample, sample_of
from sluicegate.bench.shapes import WorkerLoad, peak_rate, rate_at, slot_window
from sluicegate.bench.spec import BenchSpec

_perf_counter = time.perf_counter
# An open loop whose rate is 0 (a ramp from 0) looks again this often.


@dataclass
class PhaseResult:
    """What one worker measured in one phase."""

    samples: list[Sample] = field(default_factory=list)
    dropped: int = 0  # open loop: arrivals not sent because --max-inflight were in flight
    lags: list[float] = field(default_factory=list)  # open loop: send time - due time
    cpu_s: float = 0.0  # this worker's CPU time over the phase


class Engine:
    """Sends one worker's requests; `worker` seeds its own random streams."""

    def __init__(self, spec: BenchSpec, model: str, endpoint: Endpoint, worker: int,
                 counters: Counters | None = None) -> None:  # fmt: skip
        self._spec = spec
        self._endpoint = endpoint
        self._context = endpoint.ssl_context()
        self._mix = Mix(spec, model, endpoint, seed=spec.seed * 1_000_003 + worker)
        self._arrivals = random.Random(spec.seed * 7_919 + worker + 1)
        self._wanted = frozenset(
            {b"retry-after", spec.refusal_header.encode(), spec.queue_header.encode()}
        )
        self.counters = counters or Counters()
        self._idle: list[Connection] = []
        self._inflight = 0
        self._start = self._warm_end = 0.0
        self._stop = math.inf
        self._tickets: int | None = None
        self._result = PhaseResult()

    async def run(self, load: WorkerLoad, start_at: float, duration_s: float | None,
                  warmup_s: float) -> PhaseResult:  # fmt: skip
        """Run the phase that starts at `start_at` (a perf_counter time, shared by every
        worker): `warmup_s` of load not measured, then `duration_s` or this worker's
        share of the requests; then wait for what is in flight."""
        counters = self.counters
        for index in range(WIDTH):
            counters.values[counters.offset + index] = 0.0
        self._result = PhaseResult()
        self._start = start_at
        self._warm_end = start_at + warmup_s
        self._stop = self._warm_end + duration_s if duration_s is not None else math.inf
        self._tickets = load.requests
        delay = start_at - _perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        cpu = time.process_time()
        if not load.idle:
            if load.shape == "closed":
                await asyncio.gather(
                    *(self._slot(slot, load, duration_s) for slot in load.slots)
                )
            else:
                await self._open_loop(load, duration_s)
        for connection in self._idle:
            connection.close()
        self._idle.clear()
        self._result.cpu_s = time.process_time() - cpu
        return self._result

    # ---- closed loop -------------------------------------------------------------------

    async def _slot(self, slot: int, load: WorkerLoad, duration_s: float | None) -> None:
        on, off = slot_window(slot, load.ramp, self._warm_end, duration_s)
        connection: Connection | None = None
        try:
            while True:
                now = _perf_counter()
                if now >= self._stop or now >= off:
                    return
                if now < on:
                    await asyncio.sleep(min(on, self._stop) - now)
                    continue
                if not self._take_ticket(now):
                    return
                connection = await self._send(connection, self._mix.next())
        finally:
            if connection is not None:
                connection.close()

    def _take_ticket(self, now: float) -> bool:
        """False once this worker's share of --requests has been sent (warm-up aside)."""
        if self._tickets is None or now < self._warm_end:
            return True
        if self._tickets <= 0:
            return False
        self._tickets -= 1
        return True

    # ---- open loop ---------------------------------------------------------------------

    async def _open_loop(self, load: WorkerLoad, duration_s: float | None) -> None:
        tasks: set[asyncio.Task[None]] = set()
        due = self._next_due(self._start, load, duration_s)
        counters = self.counters
        while due < self._stop:
            now = _perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
                continue
            if not self._take_ticket(due):
                break
            measured = due >= self._warm_end
            if self._inflight >= load.max_inflight:
                counters.add(DROPPED)
                if measured:
                    self._result.dropped += 1
            else:
                if measured:
                    self._result.lags.append(now - due)
                task = asyncio.create_task(self._open_request())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            due = self._next_due(due, load, duration_s)
        if tasks:
            await asyncio.gather(*tasks)

    def _next_due(self, after: float, load: WorkerLoad, duration_s: float | None) -> float:
        """The next Poisson arrival after `after`, at the rate of its own moment. A ramp's
        rate changes over the run, so arrivals are thinned (Lewis and Shedler): drawn at
        the peak rate, each kept with probability rate(t) / peak. Drawing each gap at the
        rate of the previous arrival instead waits far too long early in a ramp from 0."""
        peak = peak_rate(load)
        if peak <= 0:
            return self._stop
        due = after
        while due < self._stop:
            due += self._arrivals.expovariate(peak)
            rate = rate_at(load, due, self._warm_end, duration_s)
            if self._arrivals.random() * peak < rate:
                return due
        return due

    async def _open_request(self) -> None:
        connection = None
        while self._idle and connection is None:
            candidate = self._idle.pop()
            if candidate.idle:
                connection = candidate
        connection = await self._send(connection, self._mix.next())
        if connection is not None and connection.idle:
            self._idle.append(connection)

    # ---- one request -------------------------------------------------------------------

    async def _send(self, connection: Connection | None, prepared: Prepared) -> Connection | None:
        """Send one request (connecting first if needed) and record it; returns the
        connection to use next, None if it was lost."""
        counters = self.counters
        counters.add(SENT)
        counters.add(INFLIGHT)
        self._inflight += 1
        sent = _perf_counter()
        try:
            if connection is None or connection.closed:
                connection = None
                try:
                    connection = await asyncio.wait_for(
                        connect(self._endpoint.host, self._endpoint.port, self._wanted,
                                self._context),
                        self._spec.timeout_s,
                    )  # fmt: skip
                except (OSError, TimeoutError) as err:
                    kind = TIMEOUT if isinstance(err, TimeoutError) else CONNECTION
                    self._record(failed_sample(sent, self._start, _perf_counter(),
                                               prepared.scenario, prepared.priority, kind,
                                               prepared.input_tokens), sent)  # fmt: skip
                    return None
            loop = asyncio.get_running_loop()
            exchange = Exchange(loop.create_future())
            # --timeout bounds the whole request, connecting included.
            left = max(0.0, self._spec.timeout_s - (_perf_counter() - sent))
            timer = loop.call_later(left, connection.expire)
            connection.send(prepared.data, exchange)
            try:
                await exchange.waiter
            finally:
                timer.cancel()
            spec = self._spec
            self._record(
                sample_of(exchange, sent, self._start, prepared.scenario, prepared.priority,
                          prepared.input_tokens, spec.refusal_header, spec.queue_header),
                sent,
            )  # fmt: skip
            return None if connection.closed else connection
        except asyncio.CancelledError:
            if connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()
            raise
        finally:
            self._inflight -= 1
            counters.add(INFLIGHT, -1.0)

    def _record(self, sample: Sample, sent: float) -> None:
        counters = self.counters
        counters.add(DONE)
        if sample.kind == OK:
            if sample.ttft is not None:
                counters.ttft(sample.ttft)
        else:
            counters.add(FAILED)
        if sent >= self._warm_end:
            self._result.samples.append(sample)
