"""NoteForwarder: the ext_proc servers' usage notes (notes.py) on their way to the control
plane's LogsService, batched (docs/fast-lane.md, "The auto lane").

    forwarder = NoteForwarder()
    forwarder.target("127.0.0.1:18000")   # each config load: the control plane's address
    forwarder.add(note)                   # from each record of an auto tenant's request
    ...
    await forwarder.close()

Notes wait at most FLUSH_S, then go in one Export call, as Envoy's record logs send
records. A note that cannot be sent (the control plane restarting) is dropped and
counted: the steering then counts less, and the fast lane's token buckets still bound
the tenant (docs/fast-lane.md, "The bound"). At most MAX_PENDING wait; more are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Final

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from sluicegate.records import LOGS_METHOD_NAME, LOGS_SERVICE_NAME

from .notes import UsageNote, note_body

FLUSH_S: Final = 0.1
MAX_PENDING: Final = 50_000
# A call that takes longer is given up (its notes dropped): the next batch is due.
CALL_TIMEOUT_S: Final = 2.0
# At shutdown, what waits gets this long: a stopping server is not held up by a control
# plane that is gone.
CLOSE_TIMEOUT_S: Final = 0.5
# How often a failing control plane is said in the log.
LOG_EVERY_S: Final = 60.0
_METHOD: Final = f"/{LOGS_SERVICE_NAME}/{LOGS_METHOD_NAME}"

log = logging.getLogger(__name__)


def _identity(data: bytes) -> bytes:
    return data


class NoteForwarder:
    """Sends the notes it is given to the control plane at `target` (module docstring)."""

    def __init__(self) -> None:
        self._target: str | None = None
        self._channel: grpc.aio.Channel | None = None
        self._pending: list[UsageNote] = []
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Future[None]] = set()
        self._wake = asyncio.Event()
        self.sent = 0
        self.dropped = 0
        self._logged_at = -LOG_EVERY_S

    def target(self, address: str | None) -> None:
        """Send to `address` (host:port) from now on; None: send nothing (what waits is
        dropped)."""
        if address == self._target:
            return
        old, self._channel = self._channel, None
        if old is not None:
            closing = asyncio.ensure_future(old.close(None))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        self._target = address
        if address is None:
            self._pending.clear()

    @property
    def pending(self) -> int:
        """Notes waiting for the next batch."""
        return len(self._pending)

    def add(self, note: UsageNote) -> None:
        """Queue `note` (from the serving event loop); without a target it is dropped (an
        auto tenant's record while the loaded config has none: a reload under way)."""
        if self._target is None:
            self.dropped += 1
            return
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append(note)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()

    async def close(self) -> None:
        """Send what waits, once (for at most CLOSE_TIMEOUT_S), then stop."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._flush(CLOSE_TIMEOUT_S)
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(None)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(FLUSH_S)  # let a batch gather, as Envoy's flush does
            self._wake.clear()
            try:
                await self._flush()
            except Exception:  # never the forwarder's end: the next batch is due
                log.exception("sending usage notes failed")

    async def _flush(self, timeout_s: float = CALL_TIMEOUT_S) -> None:
        notes, self._pending = self._pending, []
        if not notes or self._target is None:
            return
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._target)
        channel = self._channel
        export = logs_service_pb2.ExportLogsServiceRequest(
            resource_logs=[
                # The venv's opentelemetry-proto names today's scope_logs/log_records
                # thus (records.log_records).
                logs_pb2.ResourceLogs(
                    instrumentation_library_logs=[
                        logs_pb2.InstrumentationLibraryLogs(logs=[_log_record(n) for n in notes])
                    ]
                )
            ]
        )
        call: Any = channel.unary_unary(
            _METHOD, request_serializer=_identity, response_deserializer=_identity
        )
        try:
            await call(export.SerializeToString(), timeout=timeout_s)
        except asyncio.CancelledError:
            self.dropped += len(notes)  # closed while this batch was on its way
            raise
        except Exception as err:  # any failure drops the batch, never the forwarder
            self.dropped += len(notes)
            now = time.monotonic()
            if now - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.warning(
                    "the control plane at %s took no usage notes (%s); %d dropped so far",
                    self._target,
                    err.code() if isinstance(err, grpc.aio.AioRpcError) else repr(err),
                    self.dropped,
                )
            return
        self.sent += len(notes)


def _log_record(note: UsageNote) -> logs_pb2.LogRecord:
    return logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value=note_body(note)))
