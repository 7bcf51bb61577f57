"""Event loops and child processes of the bench: uvloop when available (as every serving
process of sluicegate, docs/architecture.md, "Why uvloop"), and workers that end with
the process that started them."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
from typing import Final

_PR_SET_PDEATHSIG: Final = 1


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies (best effort elsewhere)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
