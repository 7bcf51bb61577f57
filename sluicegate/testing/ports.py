"""Free TCP ports on 127.0.0.1 for the processes a test or benchmark starts."""

from __future__ import annotations

import os
import socket

# Every port handed out in this process. The kernel may offer a port again as
# soon as its probe socket closes, so two calls a moment apart could return the same
# port for two children of one document (which `sluicegate up` refuses as a socket
# collision, and which failed CI once). Never handing a port out twice rules that out.
_handed_out: set[int] = set()


def _worker_share() -> tuple[int, int]:
    """(this process's index, how many share the ports): under pytest-xdist (the
    Makefile's `-n 2`) worker gwN takes only the ports that are N modulo the workers, so
    two workers never pick the same port for the same moment; else (0, 1)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or workers < 2:
        return 0, 1
    return int(worker[2:]) % workers, workers


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free a moment ago and were never returned
    before in this process (nor are returned to another test worker: _worker_share). All
    probe sockets stay open until every port is picked."""
    index, share = _worker_share()
    sockets: list[socket.socket] = []
    chosen: list[int] = []
    try:
        while len(chosen) < count:
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            sockets.append(probe)
            port = int(probe.getsockname()[1])
            if port % share == index and port not in _handed_out:
                _handed_out.add(port)
                chosen.append(port)
        return chosen
    finally:
        for probe in sockets:
            probe.close()


def free_port() -> int:
    return free_ports(1)[0]
