"""Starts the mock providers a config declares (`mock:`), as child processes.

Separate processes, so the mocks never share an event loop (or a core's
scheduling) with the ext_proc filter they are measured through. `up` hands them to
its Supervisor, which restarts one that dies.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from sluicegate.config import Config
from sluicegate.stack.supervisor import ChildSpec

_KEY_ENV = "SLUICEGATE_MOCK_API_KEY"


def mock_argv(name: str, port: int, key: str | None, config: Config) -> list[str]:
    provider = next(p for p in config.providers if p.name == name)
    assert provider.mock is not None
    mock = provider.mock
    argv = [
        sys.executable, "-m", "sluicegate.provider",
        "--name", name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ttft-ms", str(mock.ttft_ms),
        "--itl-ms", str(mock.itl_ms),
        "--jitter-ms", str(mock.jitter_ms),
        "--output-tokens", str(mock.output_tokens),
    ]  # fmt: skip
    if mock.models:
        argv += ["--models", ",".join(mock.models)]
    if key:
        argv += ["--api-key-env", _KEY_ENV]  # not --api-key: argv is visible in `ps`
    return argv


def mock_specs(config: Config, keys: Mapping[str, str | None], log_dir: Path) -> list[ChildSpec]:
    """How to start each mock provider the config declares (the key goes in the
    environment, never on the command line)."""
    specs: list[ChildSpec] = []
    for provider in config.providers:
        if provider.mock is None:
            continue
        port = urlsplit(provider.base_url).port
        assert port is not None  # validation requires an explicit port for mocks
        key = keys.get(provider.name)
        specs.append(
            ChildSpec(
                kind="mock_provider",
                name=provider.name,
                address=f"127.0.0.1:{port}",
                argv=mock_argv(provider.name, port, key, config),
                log_path=log_dir / f"mock-{provider.name}.log",
                env={_KEY_ENV: key} if key else None,
                matched_env=(_KEY_ENV,) if key else (),
            )
        )
    return specs
