"""Free TCP ports for tests: the one helper tests and benchmarks share, re-exported."""

from __future__ import annotations

from sluicegate.testing import free_port, free_ports

__all__ = ["free_port", "free_ports"]
