"""Resilience settings: durations, defaults, per-route overrides, and the rules that need
the whole document (protocols, health checks, timeouts, ejection), each at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.config import (
    Resilience,
    effective,
    format_duration_ms,
    load_config,
    load_config_text,
    parse_duration_ms,
)
from sluicegate.config.resilience import DEFAULT_RETRY_ON

from .helpers import MINIMAL, errors_of, only, problems_of, where

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TWO = """\
version: 1
listeners:
  - name: gw
    port: 10000
providers:
  - name: alpha
    base_url: http://127.0.0.1:18081/v1
  - name: beta
    base_url: http://127.0.0.1:18082/v1
routes:
  - name: chat
    models: [m]
    backends:
      - provider: alpha
      - provider: beta
"""


@pytest.mark.parametrize(
    ("text", "ms"),
    [("250ms", 250), ("3s", 3000), ("1.5s", 1500), ("2m", 120_000), ("1h", 3_600_000),
     ("1m30s", 90_000), ("0", 0), (0, 0), ("0s", 0), (" 10S ", 10_000)],
)  # fmt: skip
def test_durations(text: object, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    ("text", "message"),
    [(30, "needs a unit: write 30s or 30ms"), ("30", "expected a duration"),
     ("3 sec", "expected a duration"), ("-1s", "expected a duration"),
     (True, "got boolean"), ("0.1ms", "shorter than 1ms"), ("9000h", "longer than a year"),
     ("", "expected a duration")],
)  # fmt: skip
def test_bad_durations(text: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration_ms(text)


def test_format_duration() -> None:
    assert (format_duration_ms(90_000), format_duration_ms(1500)) == ("90s", "1500ms")


def test_defaults_without_any_resilience_section() -> None:
    config = load_config_text(MINIMAL, "t.yaml")
    settings = effective(config.defaults, config.routes[0])
    assert settings == Resilience()
    timeouts = settings.timeouts
    assert (
        timeouts.connect, timeouts.first_byte, timeouts.stream_first_token, timeouts.idle,
        timeouts.total,
    ) == (3_000, 90_000, 15_000, 120_000, 600_000)  # fmt: skip
    assert timeouts.first_token is None  # unset: 15 s, or first_byte when shorter
    assert settings.retries.max_retries == 2
    assert tuple(settings.retries.retry_on) == DEFAULT_RETRY_ON
    assert settings.pool.idle_timeout == 50_000  # below common provider keep-alives
    assert settings.outlier_detection.max_ejection_percent == 50  # 1 of 2 can be ejected
    assert config.providers[0].protocol == "http1"
    assert config.providers[0].health_check is None


OVERRIDES = """\
version: 1
defaults:
  timeouts: {first_byte: 20s, first_token: 8s, total: 5m}
  retries: {max_retries: 4, backoff: {base: 200ms, max: 3s}}
listeners:
  - {name: gw, port: 10000}
providers:
  - {name: alpha, base_url: "http://127.0.0.1:18081/v1"}
routes:
  - name: chat
    models: [m]
    backends: [{provider: alpha}]
    timeouts: {first_byte: 10s, first_token: 0}
    retries: {backoff: {max: 5s}, retry_on: [reset]}
    outlier_detection: {enabled: false}
  - name: plain
    models: [n]
    backends: [{provider: alpha}]
"""


def test_route_overrides_only_the_fields_it_writes() -> None:
    config = load_config_text(OVERRIDES, "t.yaml")
    settings = effective(config.defaults, config.routes[0])
    assert settings.timeouts.first_byte == 10_000  # route
    assert settings.timeouts.first_token == 0  # route: streams get no per-attempt timer
    assert settings.timeouts.total == 300_000  # defaults
    assert settings.timeouts.idle == 120_000  # built in
    assert settings.retries.max_retries == 4
    assert (settings.retries.backoff.base, settings.retries.backoff.max) == (200, 5_000)
    assert settings.retries.retry_on == ["reset"]
    assert settings.outlier_detection.enabled is False
    assert settings.pool == Resilience().pool
    plain = effective(config.defaults, config.routes[1])
    assert (plain.timeouts.first_byte, plain.retries.backoff.max) == (20_000, 3_000)
    assert plain.timeouts.first_token == 8_000  # defaults
    assert plain.outlier_detection.enabled is True


@pytest.mark.parametrize(
    ("snippet", "path", "message"),
    [
        ("defaults: {timeouts: {conect: 1s}}", "defaults.timeouts.conect",
         "unknown key 'conect' (allowed: connect, first_byte, first_token, idle, total); did "
         "you mean "
         "'connect'?"),
        ("defaults: {timeouts: {connect: 5}}", "defaults.timeouts.connect",
         "a duration needs a unit: write 5s or 5ms, not 5"),
        ("defaults: {timeouts: {connect: 0}}", "defaults.timeouts.connect",
         "must be at least 1, got"),
        ("defaults: {retries: {max_retries: '3'}}", "defaults.retries.max_retries",
         "expected an integer, got string '3'"),
        ("defaults: {retries: {max_retries: 11}}", "defaults.retries.max_retries",
         "must be at most 10"),
        ("defaults: {retries: {retry_on: [reset, 200]}}", "defaults.retries.retry_on[1]",
         "expected one of connect-failure, reset, refused-stream or an HTTP status 400-599, "
         "got 200"),
        ("defaults: {retries: {retry_on: [reset, reset]}}", "defaults.retries",
         "retry_on lists 'reset' twice"),
        ("defaults: {pool: {max_pending_requests: 0}}", "defaults.pool.max_pending_requests",
         "must be at least 1"),
        ("defaults: {outlier_detection: {max_ejection_percent: 101}}",
         "defaults.outlier_detection.max_ejection_percent", "must be at most 100"),
        ("defaults: []", "defaults", "expected a mapping"),
    ],
)  # fmt: skip
def test_schema_errors_name_line_and_key(snippet: str, path: str, message: str) -> None:
    problem = only(errors_of(f"{snippet}\n{MINIMAL}"))
    assert (problem.line, problem.key_path) == (1, path)
    assert message in problem.message


def test_provider_settings_errors() -> None:
    text = MINIMAL.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    protocol: h2\n"
        "    health_check: {path: models, expected_statuses: ['200-99']}\n",
    )
    problems = errors_of(text)
    assert where(problems) == [
        (8, "providers[0].protocol"),
        (9, "providers[0].health_check.path"),
        (9, "providers[0].health_check.expected_statuses[0]"),
    ]
    assert "expected 'http1' or 'http2'" in problems[0].message


def test_route_mixing_protocols_is_an_error_at_the_backend() -> None:
    text = TWO.replace(
        "    base_url: http://127.0.0.1:18082/v1\n",
        "    base_url: http://127.0.0.1:18082/v1\n    protocol: http2\n",
    )
    problem = only(problems_of(text))
    assert (problem.file, problem.line, problem.key_path) == (
        "t.yaml", 16, "routes[0].backends[1].provider",
    )  # fmt: skip
    assert problem.is_error
    assert problem.message == (
        "route 'chat' mixes HTTP/2 provider 'beta' with HTTP/1.1 provider 'alpha' (at "
        "providers[0], line 6); Envoy speaks one protocol per route: give them the same "
        "protocol or serve them in separate routes"
    )


def test_route_health_checks_must_agree() -> None:
    text = TWO.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    health_check: {}\n",
    ).replace(
        "    base_url: http://127.0.0.1:18082/v1\n",
        "    base_url: http://127.0.0.1:18082/api\n    health_check: {interval: 5s}\n",
    )
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (17, "routes[0].backends[1].provider")
    assert "different health checks (path /api/models vs /v1/models" in problem.message
    # Same resolved path and settings: fine, also when one spells the default out.
    same = text.replace("/api\n", "/v1\n").replace("{interval: 5s}", "{path: /v1/models}")
    assert problems_of(same) == []


def test_defaults_problem_reported_once_at_defaults() -> None:
    text = "defaults:\n  retries:\n    backoff: {base: 5s}\n" + TWO
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (3, "defaults.retries.backoff.base")
    assert problem.message == "backoff base (5s) is longer than backoff max (2s)"


def test_route_problem_reported_at_the_route_field() -> None:
    text = TWO.replace(
        "    models: [m]\n",
        "    models: [m]\n    outlier_detection: {base_ejection_time: 10m}\n",
    )
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (
        13, "routes[0].outlier_detection.base_ejection_time",
    )  # fmt: skip
    assert problem.message == (
        "route 'chat': base_ejection_time (600s) is longer than max_ejection_time (300s)"
    )


@pytest.mark.parametrize(
    ("timeouts", "message"),
    [
        ("{first_byte: 30s, idle: 10s}", "idle (10s) is shorter than first_byte (30s)"),
        ("{first_byte: 30s, total: 30s, idle: 0}", "first_byte (30s) is not shorter than total"),
        ("{first_byte: 0, idle: 2m, total: 1m}", "idle (120s) is not shorter than total (60s)"),
        # first_token, for streamed requests, by the same two rules.
        (
            "{first_byte: 30s, first_token: 15s, idle: 10s}",
            "idle (10s) is shorter than first_byte (30s) and first_token (15s): the idle timer "
            "also runs while waiting for the first byte, so it fires first and they never do",
        ),
        (
            "{first_byte: 0, first_token: 20s, idle: 10s}",
            "idle (10s) is shorter than first_token (20s): the idle timer also runs while "
            "waiting for the first byte, so it fires first and it never does",
        ),
        (
            "{first_token: 1m, total: 1m, first_byte: 30s, idle: 0}",
            "first_token (60s) is not shorter than total (60s), so a slow attempt is never retried",
        ),
    ],
)
def test_timeout_combinations_that_cannot_work_are_warnings(timeouts: str, message: str) -> None:
    text = TWO.replace("    models: [m]\n", f"    models: [m]\n    timeouts: {timeouts}\n")
    problem = only(problems_of(text))
    assert problem.severity == "warning"
    assert problem.line == 13 and problem.key_path.startswith("routes[0].timeouts.")
    assert message in problem.message
    load_config_text(text, "t.yaml")  # a warning never stops loading


def test_first_token_longer_than_first_byte_is_allowed() -> None:
    """A stream's headers come sooner than a whole answer's, but a short first_byte for a
    small model's non-streamed answers does not make a 15 s first_token a mistake."""
    text = TWO.replace(
        "    models: [m]\n", "    models: [m]\n    timeouts: {first_byte: 5s, first_token: 15s}\n"
    )
    assert problems_of(text) == []


@pytest.mark.parametrize(
    ("timeouts", "streamed"),
    [("{first_byte: 5s}", 5_000), ("{first_byte: 0}", 15_000),
     ("{first_byte: 5s, idle: 8s, total: 10s}", 5_000),
     ("{first_byte: 5s, first_token: 20s}", 20_000), ("{}", 15_000)],
)  # fmt: skip
def test_an_unset_first_token_is_never_longer_than_first_byte(timeouts: str, streamed: int) -> None:
    """A route that leaves a slow non-streamed attempt within first_byte leaves a hung
    stream at least as soon, without writing first_token, and is not warned about it."""
    text = TWO.replace("    models: [m]\n", f"    models: [m]\n    timeouts: {timeouts}\n")
    assert problems_of(text) == []
    config = load_config_text(text, "t.yaml")
    assert effective(config.defaults, config.routes[0]).timeouts.stream_first_token == streamed


def test_ejection_percent_too_low_for_the_route_is_a_warning() -> None:
    text = "defaults:\n  outlier_detection: {max_ejection_percent: 10}\n" + TWO
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.severity) == (
        2, "defaults.outlier_detection.max_ejection_percent", "warning",
    )  # fmt: skip
    assert problem.message == (
        "route 'chat' has 2 providers, so max_ejection_percent 10 lets Envoy eject none of "
        "them; use at least 50"
    )
    # One provider: ejecting it would leave nothing, so there is nothing to warn about.
    assert (
        problems_of("defaults:\n  outlier_detection: {max_ejection_percent: 10}\n" + MINIMAL) == []
    )


def test_quickstart_shows_the_settings_and_is_clean() -> None:
    config = load_config(EXAMPLES / "quickstart.yaml")
    assert "defaults" in config.model_fields_set
    assert any(route.retries or route.timeouts for route in config.routes)
