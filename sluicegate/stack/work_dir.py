"""Where `up` keeps its logs, its children's sockets, `stack.json` and `up.lock`.

By default a folder of this user's (0700) in the temp directory, named after the
config file's path: the same for every `up` of that file, so the next `up` finds a
stack whose `up` died and adopts it (stack/adoption.py). It is removed when `up`
stops cleanly; `--work-dir` chooses another and keeps it. One `up` at a time runs on
a work directory: it holds an exclusive lock on `up.lock` for its lifetime
(`hold_lock`); the kernel drops the lock when `up` dies, however it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Final

# sockaddr_un.sun_path is 108 bytes, the last for the NUL; room left for the longest name.
_MAX_SOCKET_PATH_BYTES: Final = 100
_LONGEST_SOCKET_NAME: Final = "control-plane.sock"
LOCK_FILE: Final = "up.lock"


class WorkDirBusy(RuntimeError):
    """Another `up` holds the work directory's lock."""


def _digest(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:16]


def _private_folder(folder: Path) -> Path:
    """Make `folder` (0700); refuse one another user owns (it could read our logs) and a
    symlink (another user could plant one in /tmp, pointing at a folder of ours that
    `up` would fill, and remove on a clean exit)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = folder.lstat()
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise RuntimeError(f"{folder} is not a folder (a symlink?); choose --work-dir")
    if found.st_uid != os.getuid():
        raise RuntimeError(f"{folder} belongs to another user; choose --work-dir")
    folder.chmod(0o700)
    return folder


def hold_lock(work_dir: Path) -> int:
    """Lock `work_dir/up.lock` for this process's lifetime (the descriptor is returned,
    to keep open; children do not inherit it); raise WorkDirBusy naming the pid of the
    `up` that holds it. flock, not a pid in a file: two `up`s starting at once cannot
    both pass, and a killed `up`'s lock is gone with it."""
    descriptor = os.open(work_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = b""
        with contextlib.suppress(OSError):
            holder = os.pread(descriptor, 32, 0).strip()
        os.close(descriptor)
        pid = holder.decode(errors="replace") or "?"
        raise WorkDirBusy(f"another sluicegate up (pid {pid}) runs on {work_dir}; "
                          "stop it first") from None  # fmt: skip
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)  # for the message above
    return descriptor


def default_work_dir(config_path: Path) -> Path:
    """`$TMPDIR/sluicegate-up-<uid>-<digest of the config's path>`."""
    name = f"sluicegate-up-{os.getuid()}-{_digest(config_path.resolve())}"
    return _private_folder(Path(tempfile.gettempdir()) / name)


def socket_dir(work_dir: Path) -> Path:
    """Where the children's private sockets go: the work directory, unless its path is
    too long for a socket's (108 bytes); then a folder of this user's under the temp
    directory (or /tmp), named after the work directory: the same on every run."""
    mine = f"sluicegate-{os.getuid()}"
    for folder in (
        work_dir,
        Path(tempfile.gettempdir()) / mine / _digest(work_dir),
        Path("/tmp") / mine / _digest(work_dir),
    ):
        if len(str(folder / _LONGEST_SOCKET_NAME).encode()) <= _MAX_SOCKET_PATH_BYTES:
            if folder != work_dir:
                _private_folder(folder.parent)
                _private_folder(folder)
            return folder
    raise RuntimeError(f"no folder for the stack's sockets: {work_dir} is too long a path")
