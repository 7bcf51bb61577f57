"""YAML file -> validated Config, or every problem in the file at once.

Pipeline: parse (syntax, duplicate keys, key lines) -> schema (pydantic, messages
retold) -> cross-document rules (on whatever parts passed the schema) -> for
`validate_file`, the API keys too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from .document import Document
from .messages import describe, humanize
from .problems import DOCUMENT, ConfigError, Problem, has_errors, sort_problems
from .schema import Config
from .secrets import read_api_keys, read_client_keys
from .source import Locator, parse_yaml
from .validate import check_document

log = logging.getLogger("sluicegate.config")

SUPPORTED_VERSION = 1
_TOP_LEVEL = "a mapping with version, listeners, providers and routes"


@dataclass(frozen=True)
class Analysis:
    """Everything learnt from one text: the Config when it has no errors, and all problems."""

    config: Config | None
    document: Document | None
    problems: list[Problem]
    locator: Locator


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file; raise ConfigError listing every problem.

    Warnings are logged to the `sluicegate.config` logger and do not stop loading.
    """
    return load_config_text(_read(path), os.fspath(path))


def load_config_text(text: str, filename: str) -> Config:
    """Validate YAML `text` as if read from `filename` (tests, hot reload)."""
    analysis = analyse_text(text, filename)
    if analysis.config is None:
        raise ConfigError(analysis.problems)
    for problem in analysis.problems:
        log.warning("%s", problem)
    return analysis.config


def validate_text(
    text: str,
    filename: str,
    *,
    env: Mapping[str, str] | None = None,
    check_secrets: bool = True,
) -> list[Problem]:
    """All problems in `text` (errors and warnings, in file order); empty when clean.

    With `check_secrets`, API keys and client keys' secrets are resolved too (relative
    to `filename`'s directory, from `env`, default os.environ).
    """
    analysis = analyse_text(text, filename)
    problems = list(analysis.problems)
    if check_secrets and analysis.document is not None:
        environ = os.environ if env is None else env
        document, at = analysis.document, analysis.locator
        problems += read_api_keys(document.providers, at, environ)[1]
        problems += read_client_keys(document.client_keys, at, environ)[1]
    return sort_problems(problems)


def validate_file(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    check_secrets: bool = True,
) -> list[Problem]:
    """All problems in a config file, including unreadable API keys; empty when clean.

    Only problems with severity "error" should make `sluicegate validate` fail.
    """
    try:
        text = _read(path)
    except ConfigError as exc:
        return exc.problems
    return validate_text(text, os.fspath(path), env=env, check_secrets=check_secrets)


def describe_lanes(path: str | os.PathLike[str]) -> list[str]:
    """For `sluicegate validate`: which lane each tenant of a valid file takes, and why
    (Admission.describe_lane); empty for a file that does not load."""
    try:
        config = analyse_text(_read(path), os.fspath(path)).config
    except ConfigError:
        return []
    if config is None:
        return []
    if not config.tenants:
        return [config.admission.describe_gateway_lane()]
    return [config.admission.describe_lane(tenant) for tenant in config.tenants]


def analyse_text(text: str, filename: str) -> Analysis:
    parsed = parse_yaml(text, filename)
    at = Locator(filename, parsed.source)
    problems = list(parsed.problems)
    data = parsed.data
    if data is None:  # unreadable, nothing at all, only `---`, or `null`
        if not problems:
            problems.append(at.document(f"the file is empty; expected {_TOP_LEVEL}"))
        return Analysis(None, None, problems, at)
    if not isinstance(data, dict):
        problems.append(
            at.document(f"expected {_TOP_LEVEL}, got {describe(data)}", parsed.source.root_line)
        )
        return Analysis(None, None, problems, at)
    version = data.get("version")
    if _is_number(version) and version != SUPPORTED_VERSION:
        # A different schema: its other keys would only produce noise.
        message = f"unsupported version {version}; this sluicegate reads version 1"
        problems.append(at.error(("version",), message))
        return Analysis(None, None, problems, at)
    config: Config | None
    try:
        config = Config.model_validate(data)
        document = Document.from_config(config)
    except ValidationError as exc:
        config = None
        document = Document.salvage(data)
        for error in exc.errors(include_url=False):
            path, message = humanize(error, data)
            problems.append(at.error(path, message))
    problems += check_document(document, at)
    if has_errors(problems):
        config = None
    return Analysis(config, document, sort_problems(problems), at)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read(path: str | os.PathLike[str]) -> str:
    file = os.fspath(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError([Problem(file, 1, DOCUMENT, f"cannot read the file: {reason}")]) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        message = f"the file is not UTF-8 text (byte 0x{raw[exc.start]:02X})"
        raise ConfigError([Problem(file, line, DOCUMENT, message)]) from None
