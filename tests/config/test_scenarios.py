"""`scenarios:`, `routes[].scenario` and `access_log:` (issue 10): what validation accepts,
what it says about the rest, and what the model makes of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.config import DEFAULT_SCENARIO, MAX_SCENARIOS, load_config_text
from sluicegate.model import build_model

from .helpers import MINIMAL, errors_of, only, problems_of, where

ROUTES = """\
routes:
  - name: chat
    models: [m]
    scenario: chat
    backends: [{provider: alpha}]
  - name: writer
    models: [w]
    backends: [{provider: alpha}]
"""
HEAD = MINIMAL[: MINIMAL.index("routes:")]


def test_declared_scenarios_reach_the_model_with_the_implicit_default() -> None:
    text = HEAD + "scenarios: [chat, long-generation]\n" + ROUTES
    assert problems_of(text) == []
    gateway = build_model(load_config_text(text, "t.yaml"), {})
    assert gateway.scenarios == (DEFAULT_SCENARIO, "chat", "long-generation")
    assert [route.scenario for route in gateway.routes] == ["chat", DEFAULT_SCENARIO]


def test_without_scenarios_every_route_is_the_default() -> None:
    gateway = build_model(load_config_text(MINIMAL, "t.yaml"), {})
    assert gateway.scenarios == (DEFAULT_SCENARIO,)
    assert gateway.routes[0].scenario == DEFAULT_SCENARIO
    assert gateway.access_log is None


def test_default_may_be_named_and_declared_without_repeating_it() -> None:
    text = (
        HEAD
        + "scenarios: [default, chat]\n"
        + ROUTES.replace("models: [w]", "models: [w]\n    scenario: default")
    )
    assert problems_of(text) == []
    gateway = build_model(load_config_text(text, "t.yaml"), {})
    assert gateway.scenarios == (DEFAULT_SCENARIO, "chat")


def test_an_undeclared_route_scenario_is_an_error_at_its_line() -> None:
    problem = only(problems_of(MINIMAL.replace("models: [m]", "models: [m]\n    scenario: chat")))
    assert (problem.line, problem.key_path) == (11, "routes[0].scenario")
    assert problem.is_error
    assert "unknown scenario 'chat' (known: default)" in problem.message
    assert "declare it in the top-level `scenarios:`" in problem.message


def test_a_near_miss_gets_a_suggestion() -> None:
    text = (
        HEAD
        + "scenarios: [long-generation]\n"
        + ROUTES.replace("scenario: chat", "scenario: long-gen")
    )
    problem = only(problems_of(text))
    assert "did you mean 'long-generation'?" in problem.message


def test_duplicates_bad_names_and_too_many_are_errors() -> None:
    text = HEAD + "scenarios: [chat, Chat, chat]\n" + ROUTES
    problems = errors_of(text)
    assert where(problems) == [(8, "scenarios[1]"), (8, "scenarios[2]")]
    assert "must be a lowercase name" in problems[0].message
    assert "duplicate scenario 'chat' (first at scenarios[0], line 8)" in problems[1].message
    many = ", ".join(f"s{i}" for i in range(MAX_SCENARIOS + 1))
    problem = only(problems_of(HEAD + f"scenarios: [{many}]\n" + ROUTES.replace("chat", "s1")))
    assert problem.message == f"may have at most {MAX_SCENARIOS} entries"


def test_a_malformed_route_scenario_is_reported_once() -> None:
    problem = only(problems_of(MINIMAL.replace("models: [m]", "models: [m]\n    scenario: Chat")))
    assert problem.key_path == "routes[0].scenario"
    assert "must be a lowercase name" in problem.message


def test_a_broken_route_still_has_its_scenario_checked() -> None:
    text = MINIMAL.replace("models: [m]", "models: [m]\n    scenario: nope\n    weight: 3")
    assert where(errors_of(text)) == [(11, "routes[0].scenario"), (12, "routes[0].weight")]


def test_scenarios_that_are_no_list_do_not_make_every_route_unknown() -> None:
    problem = only(problems_of(HEAD + "scenarios: chat\n" + ROUTES))
    assert problem.key_path == "scenarios"
    assert "expected a list" in problem.message


# ----- access_log --------------------------------------------------------------------------


def test_access_log_to_stdout_or_an_absolute_file(tmp_path: Path) -> None:
    for path in ("stdout", str(tmp_path / "access.log")):
        text = MINIMAL + f"access_log: {{path: {path}}}\n"
        assert problems_of(text) == []
        assert build_model(load_config_text(text, "t.yaml"), {}).access_log == path


@pytest.mark.parametrize("path", ["access.log", "./logs/access.log", "stderr", "~/access.log"])
def test_access_log_must_be_stdout_or_absolute(path: str) -> None:
    problem = only(problems_of(MINIMAL + f"access_log: {{path: '{path}'}}\n"))
    assert (problem.key_path, problem.is_error) == ("access_log.path", True)
    assert "must be 'stdout' or an absolute file path" in problem.message


def test_access_log_in_a_missing_directory_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "access.log"
    problem = only(problems_of(MINIMAL + f"access_log: {{path: {path}}}\n"))
    assert (problem.key_path, problem.is_error) == ("access_log.path", False)
    assert f"directory {path.parent} does not exist here" in problem.message
    assert load_config_text(MINIMAL + f"access_log: {{path: {path}}}\n", "t.yaml")


def test_access_log_needs_its_path() -> None:
    problems = problems_of(MINIMAL + "access_log: {file: /tmp/a.log}\n")
    assert [p.message for p in problems] == [
        "missing required key 'path'",
        "unknown key 'file' (allowed: path)",
    ]
