"""A benchmark's command line: its parser with `--write`, how the run was asked for
(recorded in RESULTS), and recording the report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .results import update_section


def benchmark_parser(
    doc: str | None, write_help: str | None = "update benchmarks/RESULTS.md"
) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of the module's docstring, with
    `--write` (unless write_help is None: the benchmark records by default)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0] or None)
    if write_help is not None:
        parser.add_argument("--write", action="store_true", help=write_help)
    return parser


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """How a run was asked for, for RESULTS: `python -m <module> <its arguments>`."""
    given = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m " + module, *given])


def record(section: str, text: str, write: bool) -> None:
    """Print the report; with `write`, it replaces its section of RESULTS.md."""
    print(text)
    if write:
        update_section(section, text)


def wanted_arms(only: str | None) -> list[str] | None:
    """An `--only` option's texts: split at `|` when it has one (arm names hold commas),
    else at commas; None for every arm."""
    if not only:
        return None
    return [part for part in only.split("|" if "|" in only else ",") if part]
