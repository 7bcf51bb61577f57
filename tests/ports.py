"""Free TCP ports on 127.0.0.1 for the processes a test starts."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free a moment ago. All sockets stay open until
    every port is picked, so one document never gets the same port twice (which
    `sluicegate up` would refuse as a socket collision)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            sockets.append(probe)
        return [int(probe.getsockname()[1]) for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def free_port() -> int:
    return free_ports(1)[0]
