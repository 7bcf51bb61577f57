"""What goes wrong in a config file, and where: `Problem` and `ConfigError`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]

# key_path of problems about the whole file (syntax errors, empty file, wrong top level).
DOCUMENT = "(document)"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config file, located by file, line and key path.

    `line` is 1-based. `key_path` looks like `routes[0].backends[2].provider`.
    Warnings never stop a config from loading; errors do.
    """

    file: str
    line: int
    key_path: str
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{self.file}:{self.line}: {self.key_path}: {prefix}{self.message}"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


def sort_problems(problems: Iterable[Problem]) -> list[Problem]:
    """Order problems as they appear in their file (stable for problems on one line)."""
    return sorted(problems, key=lambda p: (p.file, p.line))


def has_errors(problems: Iterable[Problem]) -> bool:
    return any(p.is_error for p in problems)


class ConfigError(Exception):
    """A config file could not be used: `problems` lists everything found in it, in file
    order; `errors` are why it was rejected (at least one), `warnings` the rest."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sort_problems(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.is_error]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if not p.is_error]
