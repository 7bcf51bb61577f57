"""API keys: read from the environment or a file, held so that no repr, str, JSON or
error message can show them (docs/bench.md, "Keys")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

DEFAULT_KEY_ENV: Final = "OPENAI_API_KEY"


class Secret:
    """A key; only `reveal()` gives its text, which the HTTP client writes into headers."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not value or "\r" in value or "\n" in value:
            raise ValueError("an API key must be one non-empty line")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(<hidden>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        # Worker processes get the spec through a pipe (never argv): pickling must work.
        return (Secret, (self._value,))


def key_from_env(name: str) -> Secret:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ValueError(f"environment variable {name} is not set or empty")
    return Secret(value)


def key_from_file(path: str | Path) -> Secret:
    try:
        text = Path(path).read_text().strip()
    except OSError as err:
        raise ValueError(f"cannot read the key file {path}: {err.strerror}") from None
    if not text:
        raise ValueError(f"the key file {path} is empty")
    if "\n" in text:
        raise ValueError(f"the key file {path} holds more than one line")
    return Secret(text)


def default_key() -> Secret | None:
    """OPENAI_API_KEY when set, as the official SDKs do; None otherwise."""
    value = os.environ.get(DEFAULT_KEY_ENV, "").strip()
    return Secret(value) if value else None
