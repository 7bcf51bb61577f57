"""Which process holds an address another process listens on, from /proc.

`up` refuses to start a child on an address that already accepts connections
(stack/supervisor.py, `start_children`): that child would die with "address in use"
while `up`, seeing the port answer, took the other process's listener for its own.
Naming the holder's pid says what to stop. Only this user's processes can be seen
(their descriptors are private): for another user's, the pid is unknown.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sluicegate.config import parse_admin_address

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def _tcp_inodes(port: int) -> set[str]:
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                    found.add(inode)
    return found


def _unix_inodes(path: str) -> set[str]:
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == path:
                found.add(fields[6])
    return found


def holder_of(address: str) -> int | None:
    """The pid of a process of this user listening on `host:port` or `unix:/path`, if
    one can be found."""
    parsed = parse_admin_address(address)
    inodes = _unix_inodes(parsed.path) if parsed.path is not None else _tcp_inodes(parsed.port)
    wanted = {f"socket:[{inode}]" for inode in inodes}
    if not wanted:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for descriptor in os.scandir(entry / "fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(descriptor.path) in wanted:
                        return int(entry.name)
    return None


def in_use_message(what: str, address: str) -> str:
    holder = holder_of(address)
    pid = "?" if holder is None else str(holder)
    return (f"{what}: {address} is in use by another process (pid {pid}); "
            "stop it or choose another port")  # fmt: skip
