"""Rules with one home: the package's import graph has no cycle, the default health-check
path and the count of ext_proc processes are each worked out in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sluicegate.config
from sluicegate.config import Config, load_config_text
from sluicegate.config.document import Document

from .helpers import MINIMAL, problems_of

PACKAGE = Path(sluicegate.config.__file__).parent


def _local_imports(path: Path) -> set[str]:
    """Modules of this package that `path` imports, TYPE_CHECKING imports included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "sluicegate.config."
        ):
            found.add((node.module or "").split(".")[2])
    return found


def test_config_modules_import_each_other_without_a_cycle() -> None:
    graph = {path.stem: _local_imports(path) for path in PACKAGE.glob("*.py")}
    graph.pop("__init__")
    done: set[str] = set()

    def visit(module: str, trail: tuple[str, ...]) -> None:
        if module in trail:
            cycle = " -> ".join((*trail[trail.index(module) :], module))
            pytest.fail(f"import cycle: {cycle}")
        if module in done:
            return
        for imported in graph.get(module, ()):
            visit(imported, (*trail, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_public_duration_names_stay_where_they_were() -> None:
    from sluicegate.config import format_duration_ms, parse_duration_ms
    from sluicegate.config.durations import Duration

    assert parse_duration_ms("1m30s") == 90_000
    assert format_duration_ms(1500) == "1500ms"
    assert Duration is not None
    assert {"parse_duration_ms", "format_duration_ms"} <= set(sluicegate.config.__all__)


def _provider(text: str) -> Config:
    return load_config_text(MINIMAL.replace("    base_url: http://127.0.0.1:18081/v1\n", text), "t")


@pytest.mark.parametrize(
    ("provider", "path"),
    [
        ("    base_url: http://127.0.0.1:18081/v1\n", None),
        ("    base_url: http://127.0.0.1:18081/v1/\n    health_check: {}\n", "/v1/models"),
        ("    base_url: http://127.0.0.1:18081\n    health_check: {}\n", "/models"),
        (
            "    base_url: http://127.0.0.1:18081/v1\n    health_check: {path: /healthz}\n",
            "/healthz",
        ),
    ],
    ids=["none", "base-path", "no-base-path", "explicit"],
)
def test_health_check_path(provider: str, path: str | None) -> None:
    assert _provider(provider).providers[0].health_check_path == path


def test_validation_compares_the_health_check_paths_it_would_push() -> None:
    # Same default path (/v1/models) although the base URLs differ only by a slash.
    text = (
        MINIMAL.replace(
            "    base_url: http://127.0.0.1:18081/v1\n",
            "    base_url: http://127.0.0.1:18081/v1/\n    health_check: {}\n"
            "  - name: beta\n    base_url: http://127.0.0.1:18082/v1\n    health_check: {}\n"
            "  - name: gamma\n    base_url: http://127.0.0.1:18083/\n    health_check: {}\n",
        )
        + "      - provider: beta\n"
    )
    assert problems_of(text) == [p for p in problems_of(text) if "gamma" in p.message]
    mixed = text + "      - provider: gamma\n"
    messages = [p.message for p in problems_of(mixed) if p.is_error]
    assert len(messages) == 1 and "path /models vs /v1/models" in messages[0], messages


@pytest.mark.parametrize(
    ("replicas", "store_replicas", "expected"),
    [(0, 1, 1), (2, 1, 3), (0, 4, 4), (2, 2, 3), (1, 5, 5)],
)
def test_ext_proc_processes_is_one_rule_for_config_and_document(
    replicas: int, store_replicas: int, expected: int
) -> None:
    addresses = "".join(f"    - 127.0.0.1:{19000 + i}\n" for i in range(replicas))
    text = (
        MINIMAL
        + (f"sluicegate:\n  ext_proc_replicas:\n{addresses}" if replicas else "")
        + f"admission:\n  store:\n    replicas: {store_replicas}\n"
    )
    config = load_config_text(text, "t.yaml")
    assert config.ext_proc_processes() == expected
    assert Document.from_config(config).ext_proc_processes() == expected
