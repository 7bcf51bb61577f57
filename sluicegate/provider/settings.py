"""Settings of one mock provider, and the validated way to change them at runtime."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

RATE_FIELDS: tuple[str, ...] = (
    "rate_429",
    "rate_500",
    "rate_503",
    "rate_reset",
    "rate_cut",
    "rate_hang",
)

_FLOAT_FIELDS = frozenset(
    {"ttft_ms", "itl_ms", "jitter_ms", "hang_max_s", "keepalive_timeout_s", *RATE_FIELDS}
)
_INT_FIELDS = frozenset({"output_tokens", "retry_after_s"})
_BOOL_FIELDS = frozenset({"early_headers"})
_OPTIONAL_STR_FIELDS = frozenset({"api_key"})

# What POST /mock/config may change. Identity (name), the socket (host, port, TLS) and the
# connection-level keep-alive are fixed for the life of the server.
MUTABLE_FIELDS: frozenset[str] = frozenset(
    {
        "api_key",
        "models",
        "ttft_ms",
        "itl_ms",
        "jitter_ms",
        "output_tokens",
        "retry_after_s",
        "seed",
        "hang_max_s",
        "early_headers",
        *RATE_FIELDS,
    }
)


@dataclass(frozen=True)
class MockProviderSettings:
    """How one mock OpenAI-compatible provider behaves.

    Frozen so a running server can swap the whole object atomically on a config change;
    build a changed copy with :meth:`with_changes`.
    """

    name: str = "mock"
    host: str = "127.0.0.1"
    port: int = 0
    api_key: str | None = None
    models: list[str] = field(default_factory=list)
    ttft_ms: float = 20.0
    itl_ms: float = 5.0
    jitter_ms: float = 0.0
    output_tokens: int = 16
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    rate_reset: float = 0.0
    rate_cut: float = 0.0
    rate_hang: float = 0.0
    retry_after_s: int = 1
    seed: int | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # Send response headers as soon as the request is accepted (vLLM style) instead of
    # together with the first token (what OpenAI does); matters to Envoy's per-try timeouts.
    early_headers: bool = False
    # A hung request is dropped after this long so it cannot pin a task forever.
    hang_max_s: float = 3600.0
    # Idle keep-alive connections are closed after this; keep Envoy's upstream
    # idle_timeout below it or Envoy may race a reused connection against the close.
    keepalive_timeout_s: float = 75.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port out of range: {self.port}")
        for name in ("ttft_ms", "itl_ms", "jitter_ms", "hang_max_s", "keepalive_timeout_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s}")
        total = 0.0
        for name in RATE_FIELDS:
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be within 0..1, got {rate!r}")
            total += rate
        # One uniform draw picks at most one fault, so the rates must fit in [0, 1].
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates add up to {total:.3f} > 1")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.api_key == "":
            raise ValueError("api_key must not be empty (None means no key is required)")
        if any(not m for m in self.models):
            raise ValueError("model names must not be empty")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def with_changes(self, changes: Mapping[str, Any]) -> MockProviderSettings:
        """A validated copy with `changes` (JSON-like values) applied; ValueError if bad."""
        unknown = sorted(set(changes) - MUTABLE_FIELDS)
        if unknown:
            raise ValueError(f"cannot change: {', '.join(unknown)}")
        coerced = {name: _coerce(name, value) for name, value in changes.items()}
        return dataclasses.replace(self, **coerced)

    def public_view(self) -> dict[str, Any]:
        """Settings as JSON, with the API key reduced to whether one is set."""
        view = dataclasses.asdict(self)
        view["api_key"] = None
        view["api_key_set"] = self.api_key is not None
        return view


def _coerce(name: str, value: Any) -> Any:
    # JSON has no int/float distinction worth trusting, and bool is an int in Python.
    if name in _FLOAT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number")
        return float(value)
    if name in _INT_FIELDS or name == "seed":
        if value is None and name == "seed":
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer")
        return value
    if name in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a boolean")
        return value
    if name in _OPTIONAL_STR_FIELDS:
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or null")
        return value
    if name == "models":
        if isinstance(value, str):
            return parse_models(value)
        if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
            raise ValueError("models must be a list of strings")
        return list(value)
    raise ValueError(f"cannot change: {name}")  # pragma: no cover - guarded by MUTABLE_FIELDS


def parse_models(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']."""
    return [part.strip() for part in text.split(",") if part.strip()]
