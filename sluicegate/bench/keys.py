"""API keys: read from the environment or a file, held so that no repr, str, JSON or
error message can show them (docs/bench.md, "Keys")."""

from __future__ import annotations

import os
import re
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


# What a message may show of a value given where a name or a path belongs: a key put
# there by mistake (`--api-key-env sk-…`) must not be printed back.
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")


def _shown_env(name: str) -> str:
    if _ENV_NAME.fullmatch(name):
        return f"environment variable {name}"
    return "the environment variable named (not shown: it is no variable's name, maybe a key)"


def _shown_path(path: str | Path) -> str:
    text = str(path)
    if "/" in text or "." in text:
        return f"the key file {text}"
    return "the key file named (not shown: it is no path, maybe a key)"


def key_from_env(name: str) -> Secret:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ValueError(f"{_shown_env(name)} is not set or empty")
    return Secret(value)


def key_from_file(path: str | Path) -> Secret:
    try:
        text = Path(path).read_text().strip()
    except OSError as err:
        raise ValueError(f"cannot read {_shown_path(path)}: {err.strerror}") from None
    if not text:
        raise ValueError(f"{_shown_path(path)} is empty")
    if "\n" in text:
        raise ValueError(f"{_shown_path(path)} holds more than one line")
    return Secret(text)


def default_key() -> Secret | None:
    """OPENAI_API_KEY when set, as the official SDKs do; None otherwise."""
    value = os.environ.get(DEFAULT_KEY_ENV, "").strip()
    return Secret(value) if value else None
