"""Starts the mock providers a config declares (`mock:`), as child processes.

Separate processes, so the mocks never share an event loop (or a core's
scheduling) with the ext_proc filter they are measured through.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sluicegate.config import Config
from sluicegate.stack.children import spawn, stop, wait_listening

_KEY_ENV = "SLUICEGATE_MOCK_API_KEY"


@dataclass
class MockChild:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path


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


def start_mocks(config: Config, keys: dict[str, str | None], log_dir: Path) -> list[MockChild]:
    """Start every mock provider and wait until each accepts connections."""
    children: list[MockChild] = []
    try:
        for provider in config.providers:
            if provider.mock is None:
                continue
            port = urlsplit(provider.base_url).port
            assert port is not None  # validation requires an explicit port for mocks
            log_path = log_dir / f"mock-{provider.name}.log"
            key = keys.get(provider.name)
            argv = mock_argv(provider.name, port, key, config)
            env = {_KEY_ENV: key} if key else None
            children.append(MockChild(provider.name, port, spawn(argv, log_path, env), log_path))
        for child in children:
            _wait_listening(child)
    except BaseException:
        stop_mocks(children)
        raise
    return children


def stop_mocks(children: list[MockChild]) -> None:
    for child in children:
        stop(child.process)


def _wait_listening(child: MockChild, timeout_s: float = 15.0) -> None:
    what = f"mock provider {child.name}"
    wait_listening(child.process, "127.0.0.1", child.port, child.log_path, what, timeout_s)
