"""Notices when the config file, or a key file it names, changes.

Polling a stat() every 20 ms costs nothing measurable and needs no inotify
dependency; editors that replace the file (rename over it) are seen too,
because we compare content digests, not just mtimes. stat() follows symlinks,
so a key file mounted from a Kubernetes Secret (a symlink swapped on update)
is seen to change as well.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("sluicegate.watcher")


def _fingerprint(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _digest(path: Path) -> bytes | None:
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None


class _Seen:
    """What one file looked like last time: its stat fingerprint and content digest."""

    __slots__ = ("digest", "stat")

    def __init__(self, path: Path) -> None:
        self.stat = _fingerprint(path)
        self.digest = _digest(path)

    def changed(self, path: Path) -> bool:
        stat_now = _fingerprint(path)
        if stat_now == self.stat:
            return False
        self.stat = stat_now
        digest_now = _digest(path)
        if digest_now is None or digest_now == self.digest:
            return False  # mid-rename, or touched without change
        self.digest = digest_now
        return True


async def watch_files(
    paths: Callable[[], Iterable[Path]],
    on_change: Callable[[], object],
    interval_s: float = 0.02,
) -> None:
    """Call on_change whenever the content of one of `paths()` changes; runs until cancelled.

    `paths` is asked again after every change, so the set can follow the config (the key
    files of the last good config). A file that appears in the set later is remembered as
    it is then, not reported as a change.
    """
    seen = {path: _Seen(path) for path in paths()}
    while True:
        await asyncio.sleep(interval_s)
        changed = [path for path, state in seen.items() if state.changed(path)]
        if not changed:
            continue
        log.info("%s changed; reloading", ", ".join(str(path) for path in changed))
        try:
            on_change()
        except Exception:  # a bug in reload must not stop watching
            log.exception("reload after a change of %s failed", changed[0])
        wanted = list(paths())
        seen = {path: seen.get(path) or _Seen(path) for path in wanted}


async def watch_file(path: Path, on_change: Callable[[], object], interval_s: float = 0.02) -> None:
    """Call on_change whenever path's content changes; runs until cancelled."""
    await watch_files(lambda: (path,), on_change, interval_s)
