"""Test-facing endpoints: /mock/stats, /mock/reset, /mock/config and /healthz.

None of them needs the API key or is ever faulted.
"""

from __future__ import annotations

import json

from aiohttp import web

from sluicegate.provider.errors import invalid_request
from sluicegate.provider.state import STATE_KEY


def add_introspection_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/mock/stats", _get_stats)
    router.add_post("/mock/reset", _reset_stats)
    router.add_get("/mock/config", _get_config)
    router.add_post("/mock/config", _post_config)
    router.add_get("/healthz", _healthz)


async def _get_stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].stats_snapshot())


async def _reset_stats(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    state.stats.reset()
    return web.json_response(state.stats_snapshot())


async def _get_config(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].settings.public_view())


async def _post_config(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        changes = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        return invalid_request(f"invalid JSON: {exc}")
    if not isinstance(changes, dict):
        return invalid_request("the config body must be a JSON object")
    try:
        settings = state.configure(changes)
    except (ValueError, TypeError) as exc:
        return invalid_request(str(exc))
    return web.json_response(settings.public_view())


async def _healthz(request: web.Request) -> web.Response:
    # For 'is the process up' checks; /v1/models is subject to faults, this is not.
    return web.json_response({"status": "ok", "name": request.app[STATE_KEY].settings.name})
