"""The static two-stage Envoy config for tests: shared with benchmarks, re-exported."""

from __future__ import annotations

from sluicegate.testing import Provider, Route, ext_proc_filter, static_gateway

__all__ = ["Provider", "Route", "ext_proc_filter", "static_gateway"]
