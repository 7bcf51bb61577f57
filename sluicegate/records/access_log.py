"""The optional structured access log: one JSON line per request record.

For operators who ship logs rather than scrape (docs/metrics.md, "Access log"). Each
line holds the record's fields (record.py), so it names the key's *name*, never the key.
Lines of one batch from Envoy are written together and flushed once: the write goes to
the page cache (or a pipe), not to disk, so it stays off the event loop's critical path.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Final, Protocol, TextIO

from .record import RequestRecord

STDOUT: Final = "stdout"
_FIELDS: Final = tuple(item.name for item in fields(RequestRecord))


def record_line(record: RequestRecord) -> str:
    """The record as one line of JSON (no newline), fields in declaration order."""
    return json.dumps(
        {name: getattr(record, name) for name in _FIELDS},
        separators=(",", ":"),
        ensure_ascii=False,
    )


class RecordWriter(Protocol):
    """Where a RecordSink writes each batch's records (JsonLinesAccessLog, or a test's)."""

    destination: str

    def write(self, records: Iterable[RequestRecord]) -> None: ...

    def close(self) -> None: ...


class JsonLinesAccessLog:
    """Appends records to `destination`: an absolute file path, or "stdout"."""

    def __init__(self, destination: str) -> None:
        self.destination = destination
        self._stream: TextIO
        self._owned = destination != STDOUT
        if self._owned:
            self._stream = Path(destination).open("a", encoding="utf-8")  # noqa: SIM115
        else:
            self._stream = sys.stdout

    def write(self, records: Iterable[RequestRecord]) -> None:
        lines = [record_line(record) for record in records]
        if lines:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()

    def close(self) -> None:
        if self._owned:
            self._stream.close()
