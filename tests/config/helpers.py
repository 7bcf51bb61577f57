"""Shared helpers for the config tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

from sluicegate.config import Problem, validate_text

FIXTURES = Path(__file__).parent / "fixtures"

# A small valid document; tests append to it or replace parts of it.
MINIMAL = """\
version: 1
listeners:
  - name: gw
    port: 10000
providers:
  - name: alpha
    base_url: http://127.0.0.1:18081/v1
routes:
  - name: chat
    models: [m]
    backends:
      - provider: alpha
"""


def problems_of(text: str, filename: str = "t.yaml") -> list[Problem]:
    """All problems in (dedented) YAML text, API keys not checked."""
    return validate_text(textwrap.dedent(text), filename, check_secrets=False)


def where(problems: list[Problem]) -> list[tuple[int, str]]:
    return [(p.line, p.key_path) for p in problems]


def only(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, "\n".join(str(p) for p in problems)
    return problems[0]


def errors_of(text: str) -> list[Problem]:
    return [p for p in problems_of(text) if p.is_error]
