"""pydantic's validation errors, retold for someone editing YAML.

`Input should be a valid integer` becomes `expected an integer, got string 'abc'`;
`Extra inputs are not permitted` becomes `unknown key 'weigth' (allowed: provider,
weight, priority); did you mean 'weight'?`. Values under `api_key` are never echoed.
"""

from __future__ import annotations

import datetime
import difflib
import types
from collections.abc import Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from .schema import Config
from .source import KeyPath

Loc = Sequence[str | int]

_SECRET_FIELDS = frozenset({"api_key"})
_NOTHING = object()

_PATTERN_HINTS = {
    "name": "must be a lowercase name: letters a-z, digits, '.', '_' or '-', starting and "
    "ending with a letter or digit, at most 63 characters",
    "env": "must be an environment variable name: letters, digits and '_', not starting "
    "with a digit",
    "path_prefix": "must start with '/'",
}
# A scenario is a name too: routes[].scenario and each entry of `scenarios:`.
_PATTERN_HINTS["scenario"] = _PATTERN_HINTS["scenarios"] = _PATTERN_HINTS["name"]

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}

_BOUNDS = {
    "greater_than_equal": ("ge", "at least"),
    "less_than_equal": ("le", "at most"),
    "greater_than": ("gt", "greater than"),
    "less_than": ("lt", "less than"),
}


def canonical_path(data: object, loc: Loc) -> KeyPath:
    """Turn a pydantic `loc` into the key path used by SourceMap, following `data`.

    Mapping keys become str (as SourceMap records them), list indices stay int, and
    pydantic's `[key]` marker for dict-key errors is dropped.
    """
    path: list[str | int] = []
    current: object = data
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            path.append(part)
            current = current[part]
        elif isinstance(current, dict):
            match = next((k for k in current if k == part or str(k) == str(part)), _NOTHING)
            path.append(str(part) if match is _NOTHING else str(match))
            current = None if match is _NOTHING else current[match]
        else:
            path.append(part)
            current = None
    return tuple(path)


def humanize(error: ErrorDetails, data: object) -> tuple[KeyPath, str]:
    """Key path and plain-language message for one pydantic error on `data`."""
    loc = error["loc"]
    kind = error["type"]
    value = error.get("input")
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    secret = any(part in _SECRET_FIELDS for part in loc)
    got = describe(value, reveal=not secret)
    field = str(loc[-1]) if loc else ""
    path = canonical_path(data, loc)

    if kind == "missing":
        return path, f"missing required key '{field}'"
    if kind in ("extra_forbidden", "invalid_key"):
        return path, _unknown_key(loc, value if kind == "invalid_key" else loc[-1])
    if loc and loc[-1] == "[key]":
        return path, f"keys here must be strings, got {got}; put it in quotes"
    if kind == "literal_error" and tuple(loc) == ("version",):
        return path, f"expected version: 1, got {got}"
    if kind in _EXPECTED:
        if secret and kind in ("model_type", "dict_type") and isinstance(value, str):
            return path, (
                "expected a mapping with 'env' or 'file' naming where the key is, got a string "
                "(never write the key itself in this file)"
            )
        return path, f"expected {_EXPECTED[kind]}, got {got}"
    if kind == "literal_error":
        return path, f"expected {ctx.get('expected', 'one of the allowed values')}, got {got}"
    if kind in _BOUNDS:
        name, words = _BOUNDS[kind]
        return path, f"must be {words} {ctx.get(name)}, got {got}"
    if kind == "too_short":
        least = int(ctx.get("min_length", 1))
        return path, "must not be empty" if least == 1 else f"needs at least {least} entries"
    if kind == "too_long":
        return path, f"may have at most {ctx.get('max_length')} entries"
    if kind == "string_pattern_mismatch":
        # A list entry takes the hint of its list (`scenarios[2]` is a name).
        named = str(loc[-2]) if len(loc) > 1 and isinstance(loc[-1], int) else field
        hint = _PATTERN_HINTS.get(named, f"must match the pattern {ctx.get('pattern')}")
        return path, f"{hint}; got {got}"
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return path, str(ctx["error"])
    if kind == "recursion_loop":
        return path, "refers to itself (a loop of YAML aliases)"
    return path, str(error["msg"])


def describe(value: object, *, reveal: bool = True) -> str:
    """A short, human description of a YAML value: `string 'abc'`, `integer 5`, `a list`."""
    if value is None:
        return "null (an empty value)"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}" if reveal else "a boolean"
    if isinstance(value, int):
        return f"integer {value}" if reveal else "an integer"
    if isinstance(value, float):
        return f"number {value}" if reveal else "a number"
    if isinstance(value, str):
        if not reveal:
            return "a string"
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"string {shown!r}"
    if isinstance(value, datetime.date):
        shown = f" {value.isoformat()}" if reveal else ""
        return f"date{shown} (YAML reads this as a date; put it in quotes)"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, set | frozenset):
        return "a set"
    if isinstance(value, bytes):
        return "binary data"
    return f"a value of type {type(value).__name__}"


def _key_text(key: object) -> str:
    if isinstance(key, str):
        return repr(key)
    if key is None:
        return "null"
    if isinstance(key, bool):
        return str(key).lower()
    return str(key)


def _unknown_key(loc: Loc, key: object) -> str:
    shown = _key_text(key)
    model = model_at(loc[:-1])
    if model is None:
        return f"unknown key {shown}"
    allowed = list(model.model_fields)
    message = f"unknown key {shown} (allowed: {', '.join(allowed)})"
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
    if close:
        message += f"; did you mean '{close[0]}'?"
    return message


def model_at(loc: Loc) -> type[BaseModel] | None:
    """The schema model found at `loc` inside Config, or None when `loc` is not a model."""
    current: object = Config
    for part in loc:
        current = _unwrap_optional(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = current.model_fields.get(str(part))
            if info is None:
                return None
            current = info.annotation
        elif get_origin(current) in (list, dict):
            current = get_args(current)[-1]
        else:
            return None
    current = _unwrap_optional(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return current
    return None


def _unwrap_optional(annotation: object) -> object:
    if get_origin(annotation) in (Union, types.UnionType):
        options = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(options) == 1:
            return options[0]
    return annotation
