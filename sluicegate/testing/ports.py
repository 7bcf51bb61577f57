"""Free TCP ports on 127.0.0.1 for the processes a test or benchmark starts."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

# Every port handed out in this process: two calls a moment apart never return the same
# port for two children of one document (which `sluicegate up` refuses as a socket
# collision, and which failed CI once).
_handed_out: set[int] = set()
_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# How far below the kernel's ephemeral range ports are picked from, and never below
# _LOWEST (the quickstart's documented addresses, examples/quickstart.yaml, are all
# lower); with fewer than _FEWEST ports there, from the ephemeral range (_candidates).
_SPAN = 12_000
_LOWEST = 20_000
_FEWEST = 2_000


def _worker_share() -> tuple[int, int]:
    """(this process's index, how many share the ports): under pytest-xdist (the
    Makefile's `-n 2`) worker gwN takes only the ports that are N modulo the workers, so
    two workers never pick the same port for the same moment; else (0, 1)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or workers < 2:
        return 0, 1
    return int(worker[2:]) % workers, workers


def _candidates() -> range:
    """Ports just below the kernel's ephemeral range (Linux: 32768 and up). The kernel
    gives no outgoing connection and no bind to port 0 a port from there, so a port
    picked there stays free until the test's process binds it; one of the ephemeral
    range could be taken meanwhile by any connection, even a client's to that very port
    while nothing listens on it (TCP's self-connect). On a host whose ephemeral range
    leaves fewer than _FEWEST ports there, the ephemeral range itself."""
    try:
        low, high = (int(word) for word in _PORT_RANGE_FILE.read_text().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    below = range(max(_LOWEST, low - _SPAN), low)
    return below if len(below) >= _FEWEST else range(low, high + 1)


def _bound(port: int) -> socket.socket | None:
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", port))
    except OSError:
        probe.close()
        return None
    return probe


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free a moment ago and were never returned before
    in this process (nor are returned to another test worker: _worker_share), picked at
    random below the ephemeral range (_candidates). All probe sockets stay open until
    every port is picked. (Not the kernel's pick, a bind to port 0: Linux gives those
    odd ports, which would leave one of two workers none.)"""
    index, share = _worker_share()
    candidates = _candidates()
    sockets: list[socket.socket] = []
    chosen: list[int] = []
    try:
        for _ in range(len(candidates)):
            if len(chosen) == count:
                break
            port = random.choice(candidates)
            port -= (port - index) % share  # this worker's share
            if port < candidates.start or port in _handed_out:
                continue
            probe = _bound(port)
            if probe is not None:
                sockets.append(probe)
                _handed_out.add(port)
                chosen.append(port)
        if len(chosen) < count:
            raise RuntimeError(f"fewer than {count} free ports in {candidates}")
        return chosen
    finally:
        for probe in sockets:
            probe.close()


def free_port() -> int:
    return free_ports(1)[0]
