"""RecordSink: where the records of one ext_proc server go (metrics, the access log).

Holds the declared names of the current config load (labels.Declared) and swaps them
whole on reload (`load`), so a batch is labelled by one load. Each batch Envoy sends is
decoded once per record and counted; nothing here runs per chunk of a response.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from sluicegate.model import Gateway

from .access_log import JsonLinesAccessLog, RecordWriter
from .labels import Declared
from .metrics import RecordMetrics
from .record import RequestRecord, decode

log = logging.getLogger(__name__)


def log_records(export: Any) -> Iterator[Any]:
    """The LogRecords of an ExportLogsServiceRequest. The venv's opentelemetry-proto is
    old: its `instrumentation_library_logs`/`logs` are today's `scope_logs`/`log_records`
    (the same field numbers, so the same wire)."""
    for resource_logs in export.resource_logs:
        for scope_logs in resource_logs.instrumentation_library_logs:
            yield from scope_logs.logs


# Called with each record: the ext_proc server charges its reservation (filters/admission).
RecordHandler = Callable[[RequestRecord], object]
# Called after each batch's records: the ext_proc server charges what it summed in them.
BatchHandler = Callable[[], object]


class RecordSink:
    """Decodes records and feeds the metrics, `on_record` and, when set, the access log;
    `on_batch` after each batch."""

    __slots__ = ("_access_log", "_declared", "_on_batch", "_on_record", "metrics")

    def __init__(
        self,
        registry: CollectorRegistry,
        on_record: RecordHandler | None = None,
        on_batch: BatchHandler | None = None,
    ) -> None:
        self.metrics = RecordMetrics(registry)
        self._on_record = on_record
        self._on_batch = on_batch
        self._declared = Declared()
        self._access_log: RecordWriter | None = None

    @property
    def declared(self) -> Declared:
        return self._declared

    def load(self, gateway: Gateway) -> None:
        """Adopt a config load (hot reload): later records are labelled by its names, and
        go to its `access_log:` (reopened only when the destination changed)."""
        self._declared = Declared.from_gateway(gateway)
        current = self._access_log
        destination = gateway.access_log
        if destination is None:
            self.set_access_log(None)
        elif not isinstance(current, JsonLinesAccessLog) or current.destination != destination:
            self.set_access_log(JsonLinesAccessLog(destination))

    def set_access_log(self, access_log: RecordWriter | None) -> None:
        """Write every record to `access_log` from now on (None: stop); the old one closes."""
        old, self._access_log = self._access_log, access_log
        if old is not None and old is not access_log:
            old.close()

    def on_export(self, export: Any) -> int:
        """One ExportLogsServiceRequest; returns how many records it held."""
        return self.on_records(list(log_records(export)))

    def on_records(self, batch: Sequence[Any]) -> int:
        """Some OpenTelemetry LogRecords of a batch: decode, count and log each; then
        `on_batch`."""
        declared = self._declared
        metrics = self.metrics
        on_record = self._on_record
        records: list[RequestRecord] = []
        for log_record in batch:
            record = decode(log_record, declared.model_maps, declared.record_defaults)
            if not record.in_flight:  # a request still running is counted at its end
                metrics.observe(record, declared.labels(record))
            if on_record is not None:
                try:
                    on_record(record)
                except Exception:  # one record's fault never costs the batch
                    log.exception("handling a request record failed")
            if not record.in_flight:
                records.append(record)
        if self._on_batch is not None:
            try:
                self._on_batch()
            except Exception:
                log.exception("handling a batch of request records failed")
        if self._access_log is not None and records:
            try:
                self._access_log.write(records)
            except OSError:
                log.exception("access log write failed (%s)", self._access_log.destination)
        return len(records)

    def close(self) -> None:
        self.set_access_log(None)
