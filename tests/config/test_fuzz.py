"""Whatever text arrives (hot reload reads half-written files), only ConfigError escapes."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.config import Config, ConfigError, load_config_text, validate_text

from .helpers import MINIMAL

_YAML_BITS = [
    "version: 1\n",
    "listeners:",
    "providers:",
    "routes:",
    "- ",
    "  ",
    "\n",
    ": ",
    "name: a",
    "port: ",
    "base_url: http://127.0.0.1:1",
    "backends:",
    "provider: a",
    "models: [m]",
    "{",
    "}",
    "[",
    "]",
    ",",
    "&a ",
    "*a",
    "<<: *a",
    "!!int ",
    "!!binary ",
    "!foo ",
    "? ",
    "---\n",
    "...\n",
    "'",
    '"',
    "|\n",
    ">\n",
    "#",
    "%YAML 1.1\n",
    "2024-13-01",
    "0x1F",
    ".inf",
    "~",
    "null",
    "true",
    "\t",
    "\ufeff",
    "\x00",
    "é",
    "\\ud800",
    "mock: {}",
    "api_key: {env: X}",
    "tls: {}",
]

_KEYS = [
    "version",
    "listeners",
    "providers",
    "routes",
    "sluicegate",
    "limits",
    "name",
    "port",
    "address",
    "role",
    "base_url",
    "api_key",
    "env",
    "file",
    "tls",
    "model_map",
    "mock",
    "models",
    "backends",
    "provider",
    "weight",
    "priority",
    "path_prefix",
    "xds",
    "http",
]

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["http://127.0.0.1:1", "alpha", "127.0.0.1:1"]),
)
_values: st.SearchStrategy[Any] = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=5), inner, max_size=5),
    ),
    max_leaves=25,
)


def _load(text: str) -> None:
    try:
        config = load_config_text(text, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem.file == "fuzz.yaml"
            assert problem.line >= 1
            assert str(problem)
    else:
        assert isinstance(config, Config)
    assert all(p.line >= 1 for p in validate_text(text, "fuzz.yaml", env={}))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_YAML_BITS) | st.text(max_size=4), max_size=30).map("".join))
def test_yamlish_text_only_raises_config_error(text: str) -> None:
    _load(text)


@settings(max_examples=80, deadline=None)
@given(_values)
def test_structured_documents_only_raise_config_error(value: Any) -> None:
    _load(yaml.safe_dump(value, allow_unicode=True))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, len(MINIMAL) - 1), st.integers(0, 40), st.text(max_size=6))
def test_mutated_valid_document_only_raises_config_error(at: int, cut: int, insert: str) -> None:
    _load(MINIMAL[:at] + insert + MINIMAL[at + cut :])


def test_pathological_inputs() -> None:
    for text in [
        "[" * 600,
        "a: " + "[" * 400 + "]" * 400,
        "&a [*a]",
        "&a {x: *a}",
        "listeners: &a [*a]",
        "version: 1\nproviders: &p [{name: a, model_map: &m {k: *m}}]",
        "a: &a [1,1]\nb: &b [*a,*a]\nc: &c [*b,*b]\nd: &d [*c,*c]\nroutes: [*d, *d]",
        "? [a]\n: 1",
        "? {a: 1}\n: 1",
        "version: !!float x",
        "\x00",
        "version: 1\n\ud800: 1",
        'version: 1\nlisteners: [{name: "\\ud800", port: 1}]',
    ]:
        _load(text)
