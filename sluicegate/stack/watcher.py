"""Notices when the config file changes.

Polling a stat() every 100 ms costs nothing measurable and needs no inotify
dependency; editors that replace the file (rename over it) are seen too,
because we compare content digests, not just mtimes.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("sluicegate.watcher")


def _fingerprint(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _digest(path: Path) -> bytes | None:
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None


async def watch_file(path: Path, on_change: Callable[[], object], interval_s: float = 0.1) -> None:
    """Call on_change whenever path's content changes; runs until cancelled."""
    stat_seen = _fingerprint(path)
    digest_seen = _digest(path)
    while True:
        await asyncio.sleep(interval_s)
        stat_now = _fingerprint(path)
        if stat_now == stat_seen:
            continue
        stat_seen = stat_now
        digest_now = _digest(path)
        if digest_now is None or digest_now == digest_seen:
            continue  # mid-rename, or touched without change
        digest_seen = digest_now
        log.info("%s changed; reloading", path)
        try:
            on_change()
        except Exception:  # a bug in reload must not stop watching
            log.exception("reload of %s failed", path)
