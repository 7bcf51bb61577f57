"""Keys the YAML does not hold: providers' API keys, and the client keys Envoy checks
in the fast lane, read from the environment or from a file next to the YAML.

Messages name the variable or file, never the key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from .document import KeyRef
from .key_source import KeySource
from .keyhash import verify_key
from .problems import ConfigError, Problem
from .schema import Config, Provider
from .source import Locator, SourceMap, parse_yaml


def resolve_api_keys(
    config: Config,
    source_file: str | os.PathLike[str],
    env: Mapping[str, str] = os.environ,
) -> dict[str, str | None]:
    """Provider name -> API key (None for providers without `api_key`).

    `api_key.file` is relative to the directory of `source_file`. Raises ConfigError,
    located at each failing provider's `api_key`, when a key cannot be read.
    """
    file = os.fspath(source_file)
    keys, problems = read_api_keys(enumerate(config.providers), Locator(file, SourceMap()), env)
    if problems:
        # Only now pay for a second parse: the lines are for the messages (1,000 routes: ~1 s).
        at = Locator(file, _source_map(source_file))
        _, problems = read_api_keys(enumerate(config.providers), at, env)
        raise ConfigError(problems)
    return keys


def read_api_keys(
    providers: Iterable[tuple[int, Provider]],
    at: Locator,
    env: Mapping[str, str],
) -> tuple[dict[str, str | None], list[Problem]]:
    """Keys of `providers` (index in the YAML, provider) and a problem for each unreadable one."""
    base_dir = Path(at.file).parent
    keys: dict[str, str | None] = {}
    problems: list[Problem] = []
    for index, provider in providers:
        source = provider.api_key
        if source is None:
            keys[provider.name] = None
            continue
        key, trouble, path = _read(source, env, base_dir, ("providers", index, "api_key"))
        if trouble is not None:
            problems.append(at.error(path, f"{trouble} (API key of provider '{provider.name}')"))
        keys[provider.name] = key
    return keys, problems


def resolve_client_keys(
    config: Config,
    source_file: str | os.PathLike[str],
    env: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """Client key name -> the key, for each client key with a `secret` (the fast lane's:
    docs/fast-lane.md, "Keys"). Raises ConfigError, located at each failing key's
    `secret`, when one cannot be read or does not match the key's `hash`."""
    file = os.fspath(source_file)
    refs = [
        KeyRef(t, tenant.name, k, key)
        for t, tenant in enumerate(config.tenants)
        for k, key in enumerate(tenant.keys)
    ]
    keys, problems = read_client_keys(refs, Locator(file, SourceMap()), env)
    if problems:
        at = Locator(file, _source_map(source_file))
        _, problems = read_client_keys(refs, at, env)
        raise ConfigError(problems)
    return keys


def read_client_keys(
    refs: Iterable[KeyRef], at: Locator, env: Mapping[str, str]
) -> tuple[dict[str, str], list[Problem]]:
    """The keys behind `refs` that have a `secret`, and a problem for each that cannot be
    read or is not the key its `hash` was made from (a wrong variable or a stale file
    would otherwise lock the key's clients out in one lane and not the other)."""
    base_dir = Path(at.file).parent
    keys: dict[str, str] = {}
    problems: list[Problem] = []
    owners: dict[str, str] = {}  # key -> the name of the first key that is it
    for ref in refs:
        source = ref.key.secret
        if source is None:
            continue
        where = ("tenants", ref.tenant, "keys", ref.index, "secret")
        key, trouble, path = _read(source, env, base_dir, where)
        about = f"client key '{ref.key.name}' of tenant '{ref.tenant_name}'"
        if trouble is None and key is not None and not verify_key(key, ref.key.hash):
            trouble = f"{_label(source)} holds a key that does not match the key's hash"
        if trouble is None and key is not None and key in owners:
            # Envoy's key check maps a key to one client: the two would be one.
            trouble = f"{_label(source)} holds the same key as client key '{owners[key]}'"
        if trouble is not None:
            problems.append(at.error(path, f"{trouble} ({about})"))
        elif key is not None:
            keys[ref.key.name] = key
            owners[key] = ref.key.name
    return keys, problems


def _read(
    source: KeySource, env: Mapping[str, str], base_dir: Path, where: tuple[str | int, ...]
) -> tuple[str | None, str | None, tuple[str | int, ...]]:
    """(key, trouble, the path of the field it came from)."""
    if source.env is not None:
        return (*_from_env(source.env, env), (*where, "env"))
    assert source.file is not None  # KeySource holds exactly one
    return (*_from_file(source.file, base_dir), (*where, "file"))


def _label(source: KeySource) -> str:
    return f"environment variable {source.env}" if source.env else f"key file '{source.file}'"


def _from_env(name: str, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    raw = env.get(name)
    if raw is None:
        return None, f"environment variable {name} is not set"
    return _checked(raw, f"environment variable {name}")


def _from_file(name: str, base_dir: Path) -> tuple[str | None, str | None]:
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    label = f"key file '{name}'" + ("" if str(path) == name else f" ({path})")
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None, f"{label} is not UTF-8 text"
    except OSError as exc:
        return None, f"cannot read {label}: {exc.strerror or type(exc).__name__}"
    return _checked(raw, label)


def _checked(raw: str, label: str) -> tuple[str | None, str | None]:
    key = raw.strip()
    if not key:
        return None, f"{label} is empty"
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        # A newline or control character would corrupt the Authorization header.
        return None, f"{label} holds whitespace or control characters inside the key"
    return key, None


def _source_map(source_file: str | os.PathLike[str]) -> SourceMap:
    """Key lines of the file, for messages; empty when it cannot be read again."""
    try:
        text = Path(source_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return SourceMap()
    return parse_yaml(text, os.fspath(source_file)).source
