"""The one error a gate raises to turn a request away, with what the client needs to retry."""

from __future__ import annotations

from typing import Literal, TypeAlias

ShedReason: TypeAlias = Literal["queue_full", "queue_timeout", "displaced"]
SHED_REASONS: tuple[ShedReason, ...] = ("queue_full", "queue_timeout", "displaced")


class Shed(Exception):
    """A request was refused or dropped from its queue; it holds no capacity.

    `retry_after_s` (whole seconds, >= 1) goes into `Retry-After`; `message` is
    human text for the client's error body.
    """

    reason: ShedReason
    priority: str
    retry_after_s: int
    queued_s: float
    message: str

    def __init__(
        self,
        reason: ShedReason,
        priority: str,
        *,
        retry_after_s: int,
        queued_s: float,
        message: str,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.priority = priority
        self.retry_after_s = retry_after_s
        self.queued_s = queued_s
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return (
            f"Shed(reason={self.reason!r}, priority={self.priority!r}, "
            f"retry_after_s={self.retry_after_s}, queued_s={self.queued_s:.3f})"
        )
