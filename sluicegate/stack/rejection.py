"""How a process says it did not take a config file: the same words from every process."""

from __future__ import annotations

import logging
from collections.abc import Iterable


def log_rejection(
    log: logging.Logger, reasons: Iterable[object], warnings: Iterable[object]
) -> None:
    """The reasons (errors) first, as reasons; the file's warnings apart, since they
    alone would not have stopped it."""
    for reason in reasons:
        log.error("config rejected, last good config keeps serving: %s", reason)
    for warning in warnings:
        log.warning("the rejected config also has: %s", warning)
