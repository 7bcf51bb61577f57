"""Scenarios from the command line (`--scenario name=qa,share=3,input=uniform:20-200,...`)
or from a YAML file (`--scenarios FILE.yaml`); keys only by env var or file, never inline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import yaml

from sluicegate.bench.spec import Scenario, SpecError

# field as written -> Scenario's field; `-` and `_` are the same in either form
_FIELDS: Final = {
    "name": "name", "share": "share", "input": "input_tokens", "output": "output_tokens",
    "prompts": "prompts", "key_env": "key_env", "key_file": "key_file",
    "priority": "priority", "model": "model",
}  # fmt: skip
_INLINE_KEYS: Final = frozenset({"key", "api_key", "apikey"})


def _field(raw: str) -> str:
    return raw.strip().lower().replace("-", "_")

_FIELD_NAME: Final = re.compile(r"[a-z][a-z_-]{0,23}")


def parse_scenario_flag(text: str) -> Scenario:
    """One `--scenario` value. A comma that does not start a known `field=` belongs to the
    value before it, so `output=lognormal:mean=200,sigma=0.5` keeps its comma."""
    fields: dict[str, str] = {}
    last: str | None = None
    for piece in text.split(","):
        key, eq, value = piece.partition("=")
        name = _field(key)
        if eq and name in _INLINE_KEYS:
            raise SpecError(
                "--scenario", "a key is never given inline (it would show in ps and shell "
                "history): use key-env=VAR or key-file=PATH"
            )  # fmt: skip
        if eq and name in _FIELDS:
            if name in fields:
                raise SpecError("--scenario", f"{name} given twice")
            fields[name] = value.strip()
            last = name
        elif last is not None and last in ("input", "output"):
            fields[last] += "," + piece
        else:
            known = ", ".join(k.replace("_", "-") for k in _FIELDS)
            # Only a name is echoed: a stray value might be a key.
            shown = repr(key.strip()) if _FIELD_NAME.fullmatch(key.strip()) else "(not shown)"
            raise SpecError("--scenario", f"unknown field {shown}; known: {known}")
    return _scenario(fields, "--scenario", base=None)


def load_scenarios_file(path: str | Path) -> list[Scenario]:
    """`--scenarios FILE.yaml`: a list, or a mapping with `scenarios:` holding one; a
    `prompts` or `key_file` path is relative to the file."""
    flag = "--scenarios"
    try:
        document = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise SpecError(flag, f"cannot read {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise SpecError(flag, f"{path} is not YAML: {err}") from None
    if isinstance(document, dict) and set(document) == {"scenarios"}:
        document = document["scenarios"]
    if not isinstance(document, list) or not document:
        raise SpecError(flag, f"{path}: expected a list of scenarios (or scenarios: [...])")
    scenarios: list[Scenario] = []
    for index, entry in enumerate(document):
        where = f"{flag} {path}: scenario {index + 1}"
        if not isinstance(entry, dict):
            raise SpecError(where, "expected a mapping such as {name: qa, share: 3}")
        fields: dict[str, Any] = {}
        for key, value in entry.items():
            name = _field(str(key))
            if name in _INLINE_KEYS:
                raise SpecError(where, "a key is never in the file: use key_env or key_file")
            if name not in _FIELDS:
                raise SpecError(where, f"unknown field {key!r}; known: {', '.join(_FIELDS)}")
            fields[name] = value
        scenarios.append(_scenario(fields, where, base=Path(path).parent))
    return scenarios


def _scenario(fields: dict[str, Any], where: str, base: Path | None) -> Scenario:
    if "name" not in fields or not str(fields["name"]).strip():
        raise SpecError(where, "every scenario needs a name")
    values: dict[str, Any] = {}
    for name, value in fields.items():
        target = _FIELDS[name]
        if target == "share":
            try:
                values[target] = float(value)
            except (TypeError, ValueError):
                raise SpecError(where, f"share must be a number, got {value!r}") from None
        elif target in ("prompts", "key_file") and base is not None:
            values[target] = base / str(value)
        else:
            values[target] = str(value).strip()
    return Scenario(**values)
