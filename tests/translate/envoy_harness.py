"""Feed translated resources to a real Envoy 1.40 without an xDS server.

The bootstraps (`static_bootstrap`, `ads_bootstrap`, `to_dict`) live in
sluicegate.testing.bootstraps, shared with the benchmarks; this module adds what only
tests do with them: `envoy --mode validate`, and running Envoy until it is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from sluicegate.envoy import find_envoy_binary
from sluicegate.testing import (
    ads_bootstrap,
    static_bootstrap,
    to_dict,
    without_sds_config,
)

__all__ = [
    "ads_bootstrap",
    "running_envoy",
    "static_bootstrap",
    "to_dict",
    "validate",
    "with_existing_files",
    "without_sds_config",
]

ENVOY = find_envoy_binary()


SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


def with_existing_files(value: Any) -> Any:
    """A copy where every `filename` that does not exist here names the system CA bundle.

    Envoy opens data-source files even in validate mode; the fixtures name CA files of an
    imagined deployment.
    """
    if isinstance(value, dict):
        return {
            key: SYSTEM_CA
            if key == "filename" and isinstance(item, str) and not Path(item).exists()
            else with_existing_files(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [with_existing_files(item) for item in value]
    return value


def validate(bootstrap: Mapping[str, Any], tmp: Path) -> subprocess.CompletedProcess[str]:
    """`envoy --mode validate` on the bootstrap; returncode 0 means Envoy accepts it."""
    path = tmp / f"validate-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(with_existing_files(dict(bootstrap)), indent=1))
    return subprocess.run(
        [ENVOY, "--mode", "validate", "-c", str(path), "-l", "warning"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextlib.asynccontextmanager
async def running_envoy(bootstrap: Mapping[str, Any], tmp: Path) -> AsyncIterator[Path]:
    """Run Envoy on the bootstrap until its listeners accept; yields the log path."""
    config = tmp / "envoy.json"
    config.write_text(json.dumps(bootstrap, indent=1))
    log = tmp / "envoy.log"
    admin_path = tmp / "admin-address"
    with log.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            ENVOY, "-c", str(config), "--use-dynamic-base-id", "-l", "info",
            "--admin-address-path", str(admin_path), "--disable-hot-restart",
            stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ},
        )  # fmt: skip
        try:
            await _wait_ready(admin_path, process, log)
            yield log
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()


async def _wait_ready(admin_path: Path, process: asyncio.subprocess.Process, log: Path) -> None:
    """Poll the admin /ready endpoint (LIVE once listeners and clusters initialised)."""
    import aiohttp

    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise RuntimeError(f"envoy exited {process.returncode}:\n{log.read_text()[-4000:]}")
            if admin_path.exists() and admin_path.read_text().strip():
                url = f"http://{admin_path.read_text().strip()}/ready"
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url) as response:
                        if response.status == 200:
                            return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"envoy not ready in time:\n{log.read_text()[-4000:]}")
