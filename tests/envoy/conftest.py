"""Shared helpers for tests that run the real `envoy` binary."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sluicegate.envoy import find_envoy_binary
from tests.ports import free_port


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    return free_port()


def envoy_validate(config_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_envoy_binary(), "--mode", "validate", "-c", str(config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
