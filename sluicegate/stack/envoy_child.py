"""Envoy as one of `up`'s children: restarted like the others when it dies, adopted by
the next `up` when `up` itself died (stack/adoption.py).

Its bootstrap is written to the work directory under a name that is a digest of its
content, so a changed bootstrap (another xDS address, say) is another command line,
and an adopted Envoy runs only the bootstrap this `up` would give it.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Final

from sluicegate.config import parse_admin_address
from sluicegate.envoy import (
    AdminError,
    admin_base_url,
    admin_get,
    bootstrap_json,
    find_envoy_binary,
)
from sluicegate.stack.supervisor import Child, ChildSpec

_READY_TIMEOUT_S: Final = 15.0


def envoy_spec(
    work_dir: Path,
    *,
    node_id: str,
    xds: str,
    ext_proc_servers: list[str],
    admin: str,
    ads_mode: str,
    concurrency: int,
    native_module: str | None = None,
) -> ChildSpec:
    """How to start Envoy on sluicegate's bootstrap, logging at `warn` to envoy.log;
    the bootstrap names `native_module`, the native filters library, if given."""
    socket = parse_admin_address(admin).path
    if socket is not None:
        # Envoy binds the socket but does not make its directory.
        Path(socket).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = bootstrap_json(node_id=node_id, cluster="sluicegate", xds_address=xds,
                          ext_proc_address=ext_proc_servers, admin_address=admin,
                          ads_mode=ads_mode, native_module=native_module)  # fmt: skip
    bootstrap = work_dir / f"envoy-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    bootstrap.write_text(text)
    # No hot restart: Envoy's hot-restart machinery SIGTERMs it when its parent dies
    # (seen with Envoy 1.40), which would stop traffic with `up`; without it, several
    # Envoys share a machine without base ids too.
    argv = [find_envoy_binary(), "-c", str(bootstrap), "--disable-hot-restart",
            "--concurrency", str(concurrency), "--log-level", "warn"]  # fmt: skip
    return ChildSpec(kind="envoy", name=node_id, address=admin, argv=argv,
                     log_path=work_dir / "envoy.log")  # fmt: skip


class EnvoyNotReady(RuntimeError):
    """Envoy exited or did not become ready in time; the message ends with its log."""


def wait_ready(envoy: Child, timeout_s: float = _READY_TIMEOUT_S) -> None:
    """Return once Envoy's `/ready` says LIVE (it has its first config, or gave up waiting
    for it: its initial fetch timeout); raise EnvoyNotReady with its log's tail if it
    exits first or is not ready in time."""
    base = admin_base_url(envoy.spec.address)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = None if envoy.process is None else envoy.process.poll()
        if code is not None:
            raise EnvoyNotReady(f"Envoy exited with status {code} while starting; "
                                f"its log {envoy.spec.log_path}:\n{_tail(envoy)}")  # fmt: skip
        try:
            if admin_get(base, "/ready", timeout=1.0)[0] == 200:
                return
        except AdminError:
            pass
        time.sleep(0.05)
    raise EnvoyNotReady(f"Envoy not ready after {timeout_s:g} s; "
                        f"its log {envoy.spec.log_path}:\n{_tail(envoy)}")  # fmt: skip


def _tail(envoy: Child, lines: int = 40) -> str:
    if envoy.spec.log_path is None:
        return ""
    try:
        text = envoy.spec.log_path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
