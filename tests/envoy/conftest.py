"""Shared helpers for tests that run the real `envoy` binary."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from sluicegate.envoy import find_envoy_binary


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def envoy_validate(config_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_envoy_binary(), "--mode", "validate", "-c", str(config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
