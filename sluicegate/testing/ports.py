"""Free TCP ports on 127.0.0.1 for the processes a test or benchmark starts."""

from __future__ import annotations

import socket

# Every port handed out in this process. The kernel may offer a port again as
# soon as its probe socket closes, so two calls a moment apart could return the same
# port for two children of one document (which `sluicegate up` refuses as a socket
# collision, and which failed CI once). Never handing a port out twice rules that out.
_handed_out: set[int] = set()


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free a moment ago and were never returned
    before in this process. All probe sockets stay open until every port is picked."""
    sockets: list[socket.socket] = []
    chosen: list[int] = []
    try:
        while len(chosen) < count:
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            sockets.append(probe)
            port = int(probe.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                chosen.append(port)
        return chosen
    finally:
        for probe in sockets:
            probe.close()


def free_port() -> int:
    return free_ports(1)[0]
