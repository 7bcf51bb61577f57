"""Serve an aiohttp app on `host:port` or on a Unix socket `unix:/path` (mode 0600).

`up` talks to its control plane and main ext_proc over Unix sockets in its work
directory: no port to allocate, and nobody but `up`'s user can reach them.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from aiohttp import web

from sluicegate.config import ADMIN_SOCKET_MODE, parse_admin_address


async def serve_app(app: web.Application, address: str) -> web.AppRunner:
    """Start serving `app` on `address`; the caller cleans up the runner it returns."""
    parsed = parse_admin_address(address)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    if parsed.path is not None:
        if os.path.exists(parsed.path):  # left by a process that was killed
            os.unlink(parsed.path)
        await web.UnixSite(runner, parsed.path).start()
        os.chmod(parsed.path, ADMIN_SOCKET_MODE)
    else:
        await web.TCPSite(runner, parsed.host, parsed.port).start()
    return runner


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def status_endpoint(*, status: Handler, metrics: Handler, healthz: Handler,
                    drain: Handler) -> web.Application:  # fmt: skip
    """The paths of sluicegate's endpoint, served alike by `up` and the control plane:
    `/status`, `/metrics`, `/healthz`, and `POST`/`DELETE /drain/<provider>`."""
    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/drain/{provider}", drain)
    app.router.add_delete("/drain/{provider}", drain)
    return app
