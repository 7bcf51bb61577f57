"""A real redis-server for tests and benchmarks: started on a free port, stopped for
failover drills.

No persistence (`--save ''`, no AOF) and its own temporary directory, so a run
leaves nothing behind; restart() keeps the port, as a restarted Redis would.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .ports import free_port

START_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0


class RedisServer:
    """`with RedisServer() as redis: ... redis.url ...`, or start()/stop()/restart()."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port if port is not None else free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not on PATH: the limiter tests need a real Redis. "
                "`make test` installs it (Debian package `redis-server`)."
            )
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="sluicegate-redis-")
        self._log = Path(self._dir.name) / "redis.log"
        self._log.unlink(missing_ok=True)
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no"]
        args += ["--dir", self._dir.name, "--logfile", str(self._log)]
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            self._wait_for_pong()
        except BaseException:
            self.stop()
            raise

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers (a hung Redis)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)

    def restart(self) -> None:
        """Stop, then start again on the same port (clients reconnect to the same URL)."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _wait_for_pong(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited at start:\n{self._log_tail()}")
            if _pong(self.port):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"redis-server did not answer PING within {START_TIMEOUT_S} s "
                    f"on port {self.port}:\n{self._log_tail()}"
                )
            time.sleep(0.02)

    def _log_tail(self) -> str:
        if self._log is None or not self._log.exists():
            return "(no log)"
        return self._log.read_text(errors="replace")[-2000:]


def _pong(port: int) -> bool:
    """One inline PING; True when Redis answers +PONG."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False
