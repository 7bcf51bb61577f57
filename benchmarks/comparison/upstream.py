"""The one upstream of a comparison run: `python -m sluicegate.bench.fixed_upstream` in a
process (tree) of its own, so its CPU is measured apart from the peer's and the load
generator's. JSON answers come at once; streams are paced (plan.CHUNK_INTERVAL_MS)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from benchmarks.peers import Upstream
from benchmarks.peers.processes import start_server, stop_session, tree
from sluicegate.testing import free_ports

from .plan import ANSWER_TOKENS, CHUNK_INTERVAL_MS

MODEL: Final = "fixed"


@dataclass
class FixedUpstreamProcess:
    process: subprocess.Popen[bytes]
    upstream: Upstream
    argv: list[str]

    @property
    def command(self) -> str:
        """Its command line as one would type it (the port, free per run, as PORT)."""
        shown = ["python", *self.argv[1:]]
        shown[shown.index("--port") + 1] = "PORT"
        return " ".join(shown)

    def pids(self) -> list[int]:
        return tree(self.process.pid)

    def stop(self) -> None:
        stop_session(self.process)


def start_upstream(work: Path, workers: int = 1) -> FixedUpstreamProcess:
    """Start it on a free port and return once it lists its model and is idle."""
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "sluicegate.bench.fixed_upstream", "--port", str(port),
            "--model", MODEL, "--output-tokens", str(ANSWER_TOKENS),
            "--chunk-interval-ms", f"{CHUNK_INTERVAL_MS:g}", "--workers", str(workers)]  # fmt: skip
    log = work / "fixed-upstream.log"
    url = f"http://127.0.0.1:{port}"
    process = start_server(argv, log, url + "/v1/models", cwd=work, env=os.environ)
    return FixedUpstreamProcess(process, Upstream(url, MODEL), argv)
