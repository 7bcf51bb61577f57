"""The JSON-lines access log: one line per record, every field, no key."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sluicegate.records import JsonLinesAccessLog, RecordSink, RequestRecord, record_line

from .helpers import export_of, gateway, log_record, streamed


def test_a_record_is_one_line_of_its_fields() -> None:
    sink = RecordSink(CollectorRegistry())
    sink.load(gateway())
    captured: list[str] = []

    class Capture:
        destination = "capture"

        def write(self, records: Iterable[RequestRecord]) -> None:
            captured.extend(record_line(r) for r in records)

        def close(self) -> None:
            pass

    sink.set_access_log(Capture())
    sink.on_export(export_of(log_record(streamed()), log_record({})))
    assert len(captured) == 2
    line = json.loads(captured[0])
    assert line["route"] == "chat" and line["model_sent"] == "m-alpha"
    assert line["key_name"] == "ci" and line["ttft_s"] == 0.3 and line["output_tokens"] == 20
    assert "\n" not in captured[0]


def test_to_a_file(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    sink = RecordSink(CollectorRegistry())
    sink.load(gateway())
    sink.set_access_log(JsonLinesAccessLog(str(path)))
    sink.on_export(export_of(log_record(streamed()), log_record(streamed())))
    sink.on_export(export_of(log_record(streamed())))
    sink.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["tenant"] == "acme" for line in lines)


def test_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    log = JsonLinesAccessLog("stdout")
    sink = RecordSink(CollectorRegistry())
    sink.set_access_log(log)
    sink.on_export(export_of(log_record(streamed())))
    sink.close()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and json.loads(out[0])["status"] == 200


def test_the_config_s_access_log_is_followed_across_reloads(tmp_path: Path) -> None:
    """`access_log: {path: ...}` opens the file on load; a reload naming the same file
    keeps writing to it (one open), another file moves the log there, none stops it."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    sink = RecordSink(CollectorRegistry())
    sink.load(dataclasses.replace(gateway(), access_log=str(first)))
    sink.on_export(export_of(log_record(streamed())))
    sink.load(dataclasses.replace(gateway(), access_log=str(first)))
    sink.on_export(export_of(log_record(streamed())))
    sink.load(dataclasses.replace(gateway(), access_log=str(second)))
    sink.on_export(export_of(log_record(streamed())))
    sink.load(gateway())  # no access_log: none written
    sink.on_export(export_of(log_record(streamed())))
    sink.close()
    assert len(first.read_text().splitlines()) == 2
    assert len(second.read_text().splitlines()) == 1
