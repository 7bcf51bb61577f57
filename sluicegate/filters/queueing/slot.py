"""A granted share of a gate's capacity, held until the response ends."""

from __future__ import annotations

from collections.abc import Callable


class Slot:
    """One admitted request: `release()` gives its request and tokens back.

    Made by `PriorityGate.acquire`. Release is idempotent so the handler may
    call it from every exit path (response end, client gone, error) safely.
    """

    __slots__ = ("_on_release", "granted_at", "priority", "queued_s", "tokens")

    def __init__(
        self,
        priority: str,
        tokens: int,
        queued_s: float,
        granted_at: float,
        on_release: Callable[[Slot], None],
    ) -> None:
        self.priority = priority
        self.tokens = tokens
        self.queued_s = queued_s  # 0.0 when admitted at once
        self.granted_at = granted_at  # the gate's clock, for hold-time statistics
        self._on_release: Callable[[Slot], None] | None = on_release

    @property
    def released(self) -> bool:
        return self._on_release is None

    def release(self) -> None:
        """Free the capacity and wake waiters that now fit; later calls do nothing."""
        on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release(self)

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        queued = f"{self.queued_s:.3f}"
        return f"Slot({self.priority!r}, tokens={self.tokens}, queued_s={queued}, {state})"
