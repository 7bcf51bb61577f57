"""`limits:` for slow and abusive clients: defaults, durations, and bad values named by
file, line and key."""

from __future__ import annotations

import pytest

from sluicegate.config.schema import Limits
from sluicegate.model import build_model
from tests.translate.cases import config_of

from .helpers import MINIMAL, errors_of, only, problems_of


def test_defaults_suit_llm_traffic() -> None:
    limits = Limits()
    assert limits.request_headers_timeout == 10_000
    assert limits.request_timeout == 60_000
    assert limits.max_connections_per_listener == 10_000


def test_durations_reach_the_model() -> None:
    text = MINIMAL + (
        "limits:\n"
        "  request_headers_timeout: 1500ms\n"
        "  request_timeout: 2m\n"
        "  max_connections_per_listener: 64\n"
    )
    assert not errors_of(text)
    limits = build_model(config_of(text), {}).limits
    assert limits.request_headers_timeout_ms == 1_500
    assert limits.request_timeout_ms == 120_000
    assert limits.max_connections_per_listener == 64


def test_zero_turns_the_timers_off() -> None:
    text = MINIMAL + "limits: {request_headers_timeout: 0, request_timeout: 0}\n"
    assert not errors_of(text)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("request_headers_timeout: 10", "a duration needs a unit"),
        ("request_headers_timeout: soon", "expected a duration"),
        ("request_timeout: -5s", "expected a duration"),
        ("request_timeout: true", "boolean"),
        ("max_connections_per_listener: 0", "at least 1"),
        ("max_connections_per_listener: 2000000", "at most 1000000"),
        ("max_connections_per_listener: 10s", "integer"),
    ],
)
def test_bad_values_are_named_with_file_line_and_key(line: str, expected: str) -> None:
    text = MINIMAL + "limits:\n  ext_proc_message_timeout_ms: 2000\n  " + line + "\n"
    problem = only(errors_of(text))
    key = line.split(":")[0]
    assert problem.key_path == f"limits.{key}"
    assert problem.line == MINIMAL.count("\n") + 3
    assert expected in problem.message
    assert str(problem).startswith(f"t.yaml:{problem.line}: limits.{key}:")


def test_unknown_key_under_limits_is_an_error() -> None:
    text = MINIMAL + "limits: {request_header_timeout: 5s}\n"
    problem = only([p for p in problems_of(text) if p.is_error])
    assert problem.key_path == "limits.request_header_timeout"
