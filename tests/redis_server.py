"""A real redis-server for tests: the one helper tests and benchmarks share, re-exported."""

from __future__ import annotations

from sluicegate.testing import RedisServer

__all__ = ["RedisServer"]
