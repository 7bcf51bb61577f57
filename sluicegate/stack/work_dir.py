"""Where `up` keeps its logs, its children's sockets and `stack.json`.

By default a folder of this user's (0700) in the temp directory, named after the
config file's path: the same for every `up` of that file, so the next `up` finds a
stack whose `up` died and adopts it (stack/adoption.py). It is removed when `up`
stops cleanly; `--work-dir` chooses another and keeps it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Final

# sockaddr_un.sun_path is 108 bytes, the last for the NUL; room left for the longest name.
_MAX_SOCKET_PATH_BYTES: Final = 100
_LONGEST_SOCKET_NAME: Final = "control-plane.sock"


def _digest(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:16]


def _private_folder(folder: Path) -> Path:
    """Make `folder` (0700); refuse one another user owns (it could read our logs)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_uid != os.getuid():
        raise RuntimeError(f"{folder} belongs to another user; choose --work-dir")
    folder.chmod(0o700)
    return folder


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
