"""`portkey`: the Portkey AI Gateway (npm `@portkey-ai/gateway`, Node) installed under
.bench-peers/portkey from a package.json that pins `@hono/node-server` to 1.13.8 through
npm `overrides` (newer ones break its streamed answers), every other version pinned by
locks/portkey-package-lock.json (`npm ci`).

Run as `node build/start-server.js --port=PORT --headless` with NODE_ENV=production
(either turns off its web UI and log stream). It listens on every interface: the server
passes no host to @hono/node-server. It is stateless: each request names its provider in
headers (RunningPeer.headers: `x-portkey-provider: openai`, `x-portkey-custom-host:
<upstream>/v1`), and the client's `Authorization` is the provider key it forwards. What
it does per request: DOES.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

from sluicegate.testing import free_ports

from .peer import CACHE, UPSTREAM_KEY, RunningPeer, Upstream
from .processes import start_server, stop_session, tree

VERSION: Final = "1.15.2"
NODE_SERVER: Final = "1.13.8"
PACKAGE: Final = {
    "name": "bench-peer-portkey",
    "private": True,
    "dependencies": {"@portkey-ai/gateway": VERSION},
    "overrides": {"@hono/node-server": NODE_SERVER},
}
LOCK: Final = Path(__file__).resolve().parent / "locks" / "portkey-package-lock.json"
HOME: Final = CACHE / "portkey"
MODULES: Final = HOME / "node_modules"
GATEWAY: Final = MODULES / "@portkey-ai" / "gateway"
DOES: Final = (
    "validates the provider headers (and the custom host against its SSRF rules), maps "
    "the body to the provider's request and the answer (every chunk of a stream) back, "
    "with its retry handler (0 retries); no auth of its own, no limits, no cache, no "
    "logging (headless, no log client)"
)


def _installed(package: str) -> str | None:
    try:
        document = json.loads((MODULES / package / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = document.get("version")
    return version if isinstance(version, str) else None


class PortkeyGateway:
    name = "portkey"
    does = DOES

    def __init__(self, work: Path) -> None:
        self.work = work
        self._runs = itertools.count(1)

    def _current(self) -> bool:
        try:
            package = json.loads((HOME / "package.json").read_text())
        except (OSError, ValueError):
            return False
        return (
            package == PACKAGE
            and (HOME / "package-lock.json").read_bytes() == LOCK.read_bytes()
            and _installed("@portkey-ai/gateway") == VERSION
            and _installed("@hono/node-server") == NODE_SERVER
        )

    def install(self) -> None:
        if self._current():
            return
        print(f"installing into {HOME}: @portkey-ai/gateway@{VERSION} with @hono/node-server "
              f"{NODE_SERVER} (npm overrides; lock {LOCK.name})", flush=True)  # fmt: skip
        HOME.mkdir(parents=True, exist_ok=True)
        (HOME / "package.json").write_text(json.dumps(PACKAGE, indent=2) + "\n")
        shutil.copyfile(LOCK, HOME / "package-lock.json")
        # --ignore-scripts: the gateway's one script, postinstall `patch-package`, applies
        # the root project's patches/, and this project has none.
        subprocess.run(
            ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
            cwd=HOME, check=True, stdout=sys.stdout, stderr=sys.stderr,
        )  # fmt: skip
        if not self._current():
            raise RuntimeError(f"npm ci in {HOME} did not install what package.json asks")

    def version(self) -> str:
        node = subprocess.run(["node", "--version"], check=True, capture_output=True, text=True)
        return (
            f"@portkey-ai/gateway {_installed('@portkey-ai/gateway')}, @hono/node-server "
            f"{_installed('@hono/node-server')}, hono {_installed('hono')}, "
            f"Node {node.stdout.strip()}"
        )

    def start(self, upstream: Upstream) -> RunningPeer:
        work = self.work / f"{self.name}-{next(self._runs)}"
        work.mkdir(parents=True)
        (port,) = free_ports(1)
        argv = ["node", str(GATEWAY / "build" / "start-server.js"), f"--port={port}",
                "--headless"]  # fmt: skip
        log_path = work / "portkey.log"
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "NODE_ENV": "production"}
        process = start_server(argv, log_path, url + "/", cwd=work, env=env)

        def stop() -> None:
            stop_session(process)

        headers = {
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": upstream.api_base,
            "authorization": f"Bearer {UPSTREAM_KEY}",
        }
        return RunningPeer(self.name, url, upstream.model, lambda: tree(process.pid), stop,
                           headers)  # fmt: skip
