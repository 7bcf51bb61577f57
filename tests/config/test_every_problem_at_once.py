"""One `validate` run reports every problem: a field that fails validation does not hide
the rules on the rest of its section, and it does not make them judge a stand-in default."""

from __future__ import annotations

import pytest

from .helpers import MINIMAL, problems_of, where

# Four problems of different kinds: a schema error (unitless duration), a duplicate name,
# an error between two settings, and a warning between two settings.
PROVIDERS = """\
listeners:
  - {name: gw, port: 10000}
providers:
  - name: alpha
    base_url: http://127.0.0.1:8101
  - name: alpha
    base_url: http://127.0.0.1:8102
"""

IN_DEFAULTS = (
    """\
version: 1
defaults:
  timeouts:
    connect: 5
    first_byte: 30s
    idle: 10s
  retries:
    backoff:
      base: 5s
      max: 1s
"""
    + PROVIDERS
    + """\
routes:
  - name: r
    models: [m]
    backends:
      - {provider: alpha}
      - {provider: beta}
"""
)

IN_A_ROUTE = (
    "version: 1\n"
    + PROVIDERS
    + """\
routes:
  - name: r
    models: [m]
    timeouts:
      connect: 5
      first_byte: 30s
      idle: 10s
    retries:
      backoff:
        base: 5s
        max: 1s
    backends:
      - {provider: alpha}
      - {provider: beta}
"""
)


@pytest.mark.parametrize(
    ("text", "prefix"),
    [(IN_DEFAULTS, "defaults"), (IN_A_ROUTE, "routes[0]")],
    ids=["in-defaults", "in-a-route"],
)
def test_one_run_reports_all_four_problems(text: str, prefix: str) -> None:
    problems = problems_of(text)
    paths = {p.key_path: p for p in problems}
    assert f"{prefix}.timeouts.connect" in paths, problems
    assert "unit" in paths[f"{prefix}.timeouts.connect"].message
    assert "providers[1].name" in paths, problems
    assert "duplicate provider name 'alpha'" in paths["providers[1].name"].message
    base = paths.get(f"{prefix}.retries.backoff.base")
    assert base is not None and base.is_error, problems
    assert "backoff base (5s) is longer than backoff max (1s)" in base.message
    idle = paths.get(f"{prefix}.timeouts.idle")
    assert idle is not None and idle.severity == "warning", problems
    assert "idle (10s) is shorter than first_byte (30s)" in idle.message


def test_known_names_are_listed_once() -> None:
    problems = problems_of(IN_A_ROUTE)
    unknown = [p for p in problems if "unknown provider 'beta'" in p.message]
    assert [p.message for p in unknown] == ["unknown provider 'beta' (known: alpha)"]


def test_a_field_that_failed_is_not_judged_by_its_default() -> None:
    # idle is invalid (no unit), so the builtin idle (120s) stands in for it: it must not
    # be reported as shorter than first_byte (200s), which the user never wrote.
    text = MINIMAL.replace(
        "version: 1\n", "version: 1\ndefaults:\n  timeouts:\n    idle: 5\n    first_byte: 200s\n"
    )
    assert where(problems_of(text)) == [(4, "defaults.timeouts.idle")]
    route = MINIMAL + "    timeouts:\n      idle: 5\n      first_byte: 200s\n"
    assert where(problems_of(route)) == [(14, "routes[0].timeouts.idle")]


def test_a_section_that_failed_as_a_whole_stays_quiet() -> None:
    # retry_on lists 429 twice: the whole `retries` section fails (a model rule), so the
    # back-off rule, which is inside it, is not run on the defaults that stand in for it.
    text = MINIMAL + (
        "    retries:\n      retry_on: [429, 429]\n      backoff: {base: 5s, max: 1s}\n"
    )
    assert where(problems_of(text)) == [(13, "routes[0].retries")]
