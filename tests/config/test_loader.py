"""Loading: parsing, schema messages, exact lines and key paths."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from sluicegate.config import (
    Config,
    ConfigError,
    Problem,
    load_config,
    load_config_text,
    validate_file,
)

from .helpers import FIXTURES, MINIMAL, only, problems_of, where


def test_valid_fixture_loads_with_values_and_defaults() -> None:
    config = load_config(FIXTURES / "valid.yaml")
    assert isinstance(config, Config)
    assert config.sluicegate.envoy_admin == "[::1]:29901"
    assert [x.name for x in config.listeners] == ["gateway", "sidecar"]
    assert config.listeners[0].address == "127.0.0.1"  # default
    assert config.listeners[1].role == "sidecar"
    assert config.providers[0].model_map == {"gpt-4o-mini": "alpha-mini"}
    assert config.providers[1].mock is not None
    assert config.routes[0].path_prefix == "/v1/"
    assert config.routes[1].backends[0].weight == 1


def test_minimal_text_loads() -> None:
    config = load_config_text(MINIMAL, "mem.yaml")
    assert config.limits.ext_proc_message_timeout_ms == 5000
    assert validate_file(FIXTURES / "valid.yaml", env={"ALPHA_API_KEY": "k"}) == []


def test_problem_str_and_config_error_text() -> None:
    problem = Problem("a.yaml", 3, "providers[1].base_url", "bad")
    assert str(problem) == "a.yaml:3: providers[1].base_url: bad"
    warning = Problem("a.yaml", 4, "x", "meh", severity="warning")
    assert str(warning) == "a.yaml:4: x: warning: meh"
    error = ConfigError([problem, Problem("a.yaml", 1, "version", "missing")])
    assert str(error) == "a.yaml:1: version: missing\na.yaml:3: providers[1].base_url: bad"


def test_config_error_keeps_errors_and_warnings_apart() -> None:
    # One error (unknown provider) and one warning (a provider no route uses).
    text = MINIMAL.replace("provider: alpha", "provider: gamma")
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, "t.yaml")
    error = caught.value
    assert [p.key_path for p in error.errors] == ["routes[0].backends[0].provider"]
    assert [p.key_path for p in error.warnings] == ["providers[0].name"]
    assert all(p.is_error for p in error.errors)
    assert not any(p.is_error for p in error.warnings)
    assert sorted(error.problems, key=str) == sorted(error.errors + error.warnings, key=str)


def test_yaml_syntax_error_is_one_problem_at_its_line() -> None:
    text = "version: 1\nlisteners:\n  - name: gw\n    port: [10000\nproviders: []\n"
    problem = only(problems_of(text))
    assert (problem.file, problem.key_path) == ("t.yaml", "(document)")
    # The unclosed `[` is on line 4; YAML only notices at line 5.
    assert problem.line == 4
    assert problem.message == (
        "invalid YAML: a '[' on this line is not closed before line 5: "
        "did not find expected ',' or ']'"
    )


@pytest.mark.parametrize(
    ("text", "line", "opener", "found"),
    [
        ("version: 1\nroutes:\n  - models: [m, n\n    backends: []\n", 3, "'['", 4),
        ("version: 1\nsluicegate: {xds: x\nlisteners: []\n", 2, "'{'", 3),
        ('version: 1\nlisteners:\n  - name: "gw\n    port: 1\n', 3, "quote", 5),
        ("a:\n  - [1, {x: 2\n  - 3\n", 2, "'{'", 4),
    ],
    ids=["sequence", "mapping", "quote", "nested"],
)
def test_unclosed_bracket_or_quote_is_reported_where_it_opens(
    text: str, line: int, opener: str, found: int
) -> None:
    problem = only(problems_of(text))
    assert problem.line == line
    assert problem.message.startswith(
        f"invalid YAML: a {opener} on this line is not closed before line {found}: "
    )


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("version: 1\nroutes: [\n  {name: a}\n  {name: b}\n]\n", 4),
        ("version: 1\nroutes: [  # ] in a comment\n  {name: a}\n  {b: 1}\n]\n", 4),
        ('version: 1\nlisteners:\n  - name: "a\\q\n      b"\n', 3),
    ],
    ids=["comma-missing", "comment", "bad-escape"],
)
def test_a_mistake_inside_a_closed_bracket_or_quote_is_reported_where_it_is(
    text: str, line: int
) -> None:
    """Only an opener that is never closed moves the problem to its own line."""
    problem = only(problems_of(text))
    assert problem.line == line
    assert "not closed" not in problem.message


@pytest.mark.parametrize("where", ["routes", "tenants"])
def test_a_model_name_a_header_cannot_carry_is_refused(where: str) -> None:
    """The routing stage sends the model to Envoy in a header: a control character in it
    would make every reload fail in the filter, so the file is refused instead."""
    route_model = '"bad\\tname"' if where == "routes" else "m"
    text = MINIMAL.replace("models: [m]", f"models: [{route_model}]")
    if where == "tenants":
        text += 'tenants: [{name: t, models: ["x\\u0001"]}]\n'
    problem = only([p for p in problems_of(text) if p.is_error])
    assert problem.key_path == f"{where}[0].models"
    assert "control character" in problem.message


def test_a_model_name_with_a_backslash_is_refused() -> None:
    """A body writes it escaped, and Envoy's model reader matches names as written
    (docs/fast-lane.md)."""
    text = MINIMAL.replace("models: [m]", 'models: ["a\\\\b"]')
    problem = only([p for p in problems_of(text) if p.is_error])
    assert problem.key_path == "routes[0].models"
    assert "backslash" in problem.message


@pytest.mark.parametrize("name", ["not-found", "models", "answered-not_json", "other", "none"])
def test_a_reserved_route_name_is_refused(name: str) -> None:
    """Envoy's 404, model-listing and refusal routes are named in their records: a route
    of such a name would have its requests counted as unrouted or refused. `other` and
    `none` are the route label of an undeclared and of a missing route: its series would
    merge with theirs."""
    problem = only([p for p in problems_of(MINIMAL.replace("name: chat", f"name: {name}"))
                    if p.is_error])  # fmt: skip
    assert (problem.line, problem.key_path) == (9, "routes[0].name")
    assert "is reserved" in problem.message
    assert "'other'" in problem.message


@pytest.mark.parametrize(
    ("edit", "line", "key_path", "name"),
    [
        (("alpha", "other"), 6, "providers[0].name", "other"),
        (("models: [m]", "models: [m, none]"), 10, "routes[0].models", "none"),
        (("", "scenarios: [other]\n"), 13, "scenarios[0]", "other"),
        (("", "tenants: [{name: none}]\n"), 13, "tenants[0].name", "none"),
        (("", "tenants: [{name: anonymous}]\n"), 13, "tenants[0].name", "anonymous"),
        (("", "tenants: [{name: t, models: [other]}]\n"), 13, "tenants[0].models", "other"),
        (
            ("", "admission:\n  priority_classes: [{name: other, max_queue: 1, max_wait: 1s}]\n"),
            14,
            "admission.priority_classes[0].name",
            "other",
        ),
    ],
    ids=["provider", "model", "scenario", "tenant", "anonymous-tenant", "tenant-model", "class"],
)
def test_a_name_that_is_a_label_of_its_own_is_refused(
    edit: tuple[str, str], line: int, key_path: str, name: str
) -> None:
    """`other` and `none` are what the metric labels give an undeclared and a missing
    name (records/labels.py), and `anonymous` the tenant of requests without a key or
    whose key was refused: a provider, model, tenant, class or scenario of such a name
    would have its series merged with theirs."""
    old, new = edit
    text = MINIMAL.replace(old, new) if old else MINIMAL + new
    problem = only([p for p in problems_of(text) if p.is_error])
    assert (problem.line, problem.key_path) == (line, key_path)
    assert f"{name!r} is reserved" in problem.message
    assert "series would merge" in problem.message


def test_yaml_bad_indentation_line() -> None:
    problem = only(problems_of("version: 1\nlisteners:\n  - name: gw\n   port: 1\n"))
    assert problem.line == 4


def test_several_documents_in_one_file() -> None:
    problem = only(problems_of(MINIMAL + "---\nversion: 1\n"))
    assert problem.line == 13
    assert "single document" in problem.message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_file(text: str) -> None:
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (1, "(document)")
    assert "empty" in problem.message


@pytest.mark.parametrize(
    ("text", "got"),
    [("- version: 1\n", "a list"), ("just text\n", "string 'just text'"), ("3\n", "integer 3")],
)
def test_top_level_must_be_a_mapping(text: str, got: str) -> None:
    problem = only(problems_of(text))
    assert problem.key_path == "(document)"
    assert problem.message.endswith(f"got {got}")
    assert "version, listeners, providers and routes" in problem.message


def test_missing_version() -> None:
    problem = only(problems_of("# header\n" + MINIMAL.replace("version: 1\n", "")))
    assert (problem.line, problem.key_path) == (2, "version")
    assert problem.message == "missing required key 'version'"


def test_unsupported_version_reports_only_that() -> None:
    problem = only(problems_of("version: 2\nwhatever: {}\n"))
    assert (problem.line, problem.key_path) == (1, "version")
    assert problem.message == "unsupported version 2; this sluicegate reads version 1"


def test_version_as_string() -> None:
    problem = only(problems_of(MINIMAL.replace("version: 1", "version: '1'")))
    assert problem.message == "expected version: 1, got string '1'"


def test_unknown_key_lists_allowed_keys_and_suggests() -> None:
    problem = only(problems_of(MINIMAL + "        weigth: 3\n"))
    assert (problem.line, problem.key_path) == (13, "routes[0].backends[0].weigth")
    assert problem.message == (
        "unknown key 'weigth' (allowed: provider, weight, priority); did you mean 'weight'?"
    )


def test_unknown_top_level_key() -> None:
    problem = only(problems_of("rotues: []\n" + MINIMAL))
    assert (problem.line, problem.key_path) == (1, "rotues")
    assert problem.message.startswith("unknown key 'rotues' (allowed: version, sluicegate,")
    assert problem.message.endswith("did you mean 'routes'?")


def test_wrong_type_message() -> None:
    problem = only(problems_of(MINIMAL.replace("port: 10000", "port: abc")))
    assert (problem.line, problem.key_path) == (4, "listeners[0].port")
    assert problem.message == "expected an integer, got string 'abc'"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("port: 10000", "port: 70000", "must be at most 65535, got integer 70000"),
        ("port: 10000", "port: true", "expected an integer, got boolean true"),
        ("port: 10000", "port: 1.5", "expected an integer, got number 1.5"),
        ("name: gw", "name: GW", "must be a lowercase name"),
        ("models: [m]", "models: []", "must not be empty"),
        ("models: [m]", "models: m", "expected a list, got string 'm'"),
        ("port: 10000", "port:", "expected an integer, got null (an empty value)"),
    ],
)
def test_value_messages(old: str, new: str, message: str) -> None:
    problem = only(problems_of(MINIMAL.replace(old, new)))
    assert problem.message.startswith(message)


def test_list_item_error_points_at_the_item() -> None:
    text = MINIMAL.replace("models: [m]", "models:\n      - m\n      - 5")
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (12, "routes[0].models[1]")
    assert problem.message == "expected a string, got integer 5"


def test_missing_required_key_points_at_parent_mapping() -> None:
    text = MINIMAL + "  - name: second\n    models: [x]\n"
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (13, "routes[1].backends")
    assert problem.message == "missing required key 'backends'"


def test_missing_key_in_nested_mapping_uses_the_parent_key_line() -> None:
    text = MINIMAL.replace("    port: 10000\n", "    port: 10000\n    address:\n")
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (5, "listeners[0].address")


def test_api_key_value_is_never_echoed() -> None:
    text = MINIMAL.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    api_key: sk-live-SECRET\n",
    )
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (8, "providers[0].api_key")
    assert "SECRET" not in str(problem)
    assert "never write the key itself" in problem.message


def test_api_key_needs_exactly_one_source() -> None:
    text = MINIMAL.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n    api_key: {env: A, file: b}\n",
    )
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (8, "providers[0].api_key")
    assert problem.message == "give exactly one of 'env' or 'file'"


def test_credentials_in_base_url_are_not_echoed() -> None:
    text = MINIMAL.replace("http://127.0.0.1", "http://user:SECRET@127.0.0.1")
    problem = only(problems_of(text))
    assert problem.key_path == "providers[0].base_url"
    assert "SECRET" not in str(problem)


def test_model_map_key_paths() -> None:
    text = MINIMAL.replace(
        "    base_url: http://127.0.0.1:18081/v1\n",
        "    base_url: http://127.0.0.1:18081/v1\n"
        "    model_map:\n"
        "      m: 5\n"
        "      gpt-4.1: x\n"
        "      7: y\n",
    )
    problems = [p for p in problems_of(text) if p.severity == "error"]
    assert where(problems) == [
        (9, "providers[0].model_map.m"),
        (11, 'providers[0].model_map["7"]'),  # quoted: a key, not a list index
    ]
    assert problems[1].message == "keys here must be strings, got integer 7; put it in quotes"


def test_several_problems_are_all_reported() -> None:
    problems = problems_of((FIXTURES / "several_problems.yaml").read_text(), "several.yaml")
    assert [str(p) for p in problems] == [
        "several.yaml:5: listeners[1].name: duplicate listener name 'public' "
        "(first at listeners[0].name, line 3)",
        "several.yaml:6: listeners[1].port: expected an integer, got string '8081'",
        "several.yaml:10: providers[0].tls: tls settings need an https:// base_url; "
        "this provider is reached over http://",
        "several.yaml:16: routes[0].backends[0].weigth: unknown key 'weigth' "
        "(allowed: provider, weight, priority); did you mean 'weight'?",
        "several.yaml:17: routes[0].backends[1].provider: unknown provider 'gama' (known: alpha)",
    ]


def test_duplicate_yaml_keys_are_errors() -> None:
    problems = problems_of((FIXTURES / "duplicate_keys.yaml").read_text())
    assert where(problems) == [(5, "listeners[0].port"), (13, "routes"), (13, "routes")]
    assert problems[0].message.startswith("duplicate key 'port' (first at line 4)")
    assert problems[1].message.startswith("duplicate key 'routes' (first at line 9)")
    assert problems[2].message == "must not be empty"  # the last value is the one read
    with pytest.raises(ConfigError):
        load_config(FIXTURES / "duplicate_keys.yaml")


def test_duplicate_keys_in_flow_mapping_and_equal_scalars() -> None:
    text = MINIMAL.replace("- provider: alpha", "- {provider: alpha, weight: 1, weight: 2}")
    assert where(problems_of(text)) == [(12, "routes[0].backends[0].weight")]


def test_merge_keys_are_not_duplicates() -> None:
    text = MINIMAL.replace(
        "      - provider: alpha\n",
        "      - &b {provider: alpha, weight: 2}\n      - {<<: *b, weight: 3, provider: beta}\n",
    )
    problems = problems_of(text)
    # Only the reference to the unknown provider 'beta' is wrong; `<<` is fine.
    assert where(problems) == [(13, "routes[0].backends[1].provider")]


def test_bad_timestamp_scalar_is_located() -> None:
    problem = only(problems_of(MINIMAL + "extra: 2024-13-45\n"))
    assert problem.line == 13
    assert problem.message.startswith("invalid YAML value")


def test_date_value_gets_a_hint() -> None:
    problem = only(problems_of(MINIMAL.replace("models: [m]", "models: [2024-01-02]")))
    assert "put it in quotes" in problem.message


def test_unknown_tag_is_a_yaml_problem() -> None:
    problem = only(problems_of(MINIMAL.replace("port: 10000", "port: !!python/object:os.system x")))
    assert problem.line == 4


def test_load_config_raises_with_file_name(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(MINIMAL.replace("port: 10000", "port: x"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    (problem,) = caught.value.problems
    assert str(problem).startswith(f"{path}:4: listeners[0].port: ")


def test_missing_and_undecodable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "nope.yaml")
    assert "cannot read the file" in str(caught.value)
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"version: 1\n# caf\xe9\n")
    (problem,) = validate_file(path)
    assert problem.line == 2
    assert "not UTF-8" in problem.message


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())
    assert load_config(path).version == 1


def test_warnings_do_not_stop_loading(caplog: pytest.LogCaptureFixture) -> None:
    text = MINIMAL + "  - name: again\n    models: [m, m]\n    path_prefix: /x/\n"
    text += "    backends: [{provider: alpha}]\n"
    with caplog.at_level(logging.WARNING, logger="sluicegate.config"):
        config = load_config_text(text, "w.yaml")
    assert len(config.routes) == 2
    assert "w.yaml:14: routes[1].models[1]: warning: model 'm' is listed twice" in caplog.text


def test_errors_and_warnings_both_land_in_config_error() -> None:
    text = textwrap.dedent(MINIMAL).replace("port: 10000", "port: 0")
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, "x.yaml")
    assert [p.severity for p in caught.value.problems] == ["error"]


@pytest.mark.parametrize("module", ["libsluicegate_native.so", "./lib.so", "on", ""])
def test_native_filters_module_is_node_off_auto_or_an_absolute_path(module: str) -> None:
    """A relative path would be read from whatever directory Envoy started in."""
    text = MINIMAL + f"native_filters:\n  module: '{module}'\n"
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (14, "native_filters.module")
    assert "'node' or 'off' or 'auto' or an absolute file path" in problem.message


@pytest.mark.parametrize(
    "module", ["node", "off", "auto", "/opt/sluicegate/libsluicegate_native.so"]
)
def test_native_filters_module_accepts(module: str) -> None:
    text = MINIMAL + f"native_filters: {{module: '{module}'}}\n"
    assert load_config_text(text, "mem.yaml").native_filters.module == module


@pytest.mark.parametrize("written", ["off", "no", "false"])
def test_native_filters_module_off_may_be_unquoted(written: str) -> None:
    """YAML reads an unquoted `off` as false: still off, as the docs write it."""
    text = MINIMAL + f"native_filters:\n  module: {written}\n"
    assert load_config_text(text, "mem.yaml").native_filters.module == "off"


def test_native_filters_are_each_envoys_own_by_default() -> None:
    """`node`: each Envoy the library its bootstrap names (stack/native_nodes.py)."""
    assert load_config_text(MINIMAL, "mem.yaml").native_filters.module == "node"
