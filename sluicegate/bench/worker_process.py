"""`python -m sluicegate.bench.worker_process INDEX PIPE_FD COUNTERS_FD`: one worker of a
WorkerPool (sluicegate/bench/workers.py). Not a command for users."""

from __future__ import annotations

import mmap
import os
import sys
from multiprocessing.connection import Connection

from sluicegate.bench.progress import WIDTH
from sluicegate.bench.workers import worker_main


def main(argv: list[str]) -> int:
    index, pipe_fd, counters_fd = (int(value) for value in argv)
    size = os.fstat(counters_fd).st_size
    shared = memoryview(mmap.mmap(counters_fd, size)).cast("d")
    assert len(shared) >= (index + 1) * WIDTH
    worker_main(index, Connection(pipe_fd), shared)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
