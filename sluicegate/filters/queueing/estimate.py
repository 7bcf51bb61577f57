"""How long a slot is held, smoothed, and the Retry-After estimate built from it."""

from __future__ import annotations

import math

RETRY_AFTER_MIN_S = 1
RETRY_AFTER_MAX_S = 60


class HoldTimes:
    """Exponentially weighted moving average of slot hold times (seconds).

    Recent releases dominate (weight `alpha`), so the estimate follows a
    provider that slows down or recovers within a few dozen requests.
    """

    __slots__ = ("_alpha", "_mean")

    def __init__(self, alpha: float = 0.2) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self._alpha = alpha
        self._mean: float | None = None

    @property
    def mean_s(self) -> float | None:
        """The smoothed hold time, or None before the first release."""
        return self._mean

    def add(self, hold_s: float) -> None:
        hold_s = max(0.0, hold_s)
        if self._mean is None:
            self._mean = hold_s
        else:
            self._mean += self._alpha * (hold_s - self._mean)


def retry_after_s(ahead: int, mean_hold_s: float | None, concurrency: int) -> int:
    """Seconds until a retry has a fair chance: the queue ahead must drain first.

    (waiters ahead in this and higher classes + 1) * mean hold time / the
    slots this class can use, rounded up and clamped to [1, 60]; 1 without history.
    """
    if mean_hold_s is None:
        return RETRY_AFTER_MIN_S
    estimate = (max(0, ahead) + 1) * mean_hold_s / max(1, concurrency)
    if not math.isfinite(estimate):
        return RETRY_AFTER_MAX_S
    return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(estimate)))
