"""Fixtures the stack tests share."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def hung_socket(tmp_path: Path) -> Iterator[str]:
    """A Unix socket that accepts connections and never answers (a wedged child or Envoy)."""
    path = tmp_path / "hung.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        listening.listen(16)
        yield f"unix:{path}"
