"""A run's every figure as JSON (`--json FILE`), and read back (`--from-json FILE`), so
that its section can be written again from what was measured, without measuring."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .peer_round import PeerRound
from .plan import Phase, Plan
from .report import RunInfo
from .step import Step


def save(path: Path, info: RunInfo, results: list[PeerRound]) -> None:
    document = {
        "info": dataclasses.asdict(info),
        "results": [dataclasses.asdict(result) for result in results],
    }
    path.write_text(json.dumps(document, indent=1))


def _step(fields: dict[str, Any] | None) -> Step | None:
    return Step(**fields) if fields is not None else None


def _steps(items: list[dict[str, Any]]) -> list[Step]:
    return [Step(**fields) for fields in items]


def _plan(fields: dict[str, Any]) -> Plan:
    phases = {k: Phase(**v) for k, v in fields.items() if isinstance(v, dict)}
    lists = {k: tuple(v) for k, v in fields.items() if isinstance(v, list)}
    return Plan(**{**fields, **phases, **lists})


def load(path: Path) -> tuple[RunInfo, list[PeerRound]]:
    document = json.loads(path.read_text())
    info_fields = document["info"]
    info = RunInfo(**{**info_fields, "plan": _plan(info_fields["plan"])})
    results = []
    for fields in document["results"]:
        results.append(PeerRound(**{
            **fields,
            "latency": _step(fields["latency"]),
            "sweep": _steps(fields["sweep"]),
            "stream": _step(fields["stream"]),
            "stream_ramp": _steps(fields["stream_ramp"]),
            "stream_retried": _steps(fields["stream_retried"]),
        }))  # fmt: skip
    return info, results
