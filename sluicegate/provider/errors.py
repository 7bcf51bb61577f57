"""OpenAI-shaped error responses: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from sluicegate.provider.sse import dumps


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    type_: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        error_body(message, type_, param=param, code=code),
        status=status,
        headers=headers,
        dumps=dumps,
    )


def invalid_request(
    message: str, *, status: int = 400, param: str | None = None, code: str | None = None
) -> web.Response:
    return error_response(status, message, "invalid_request_error", param=param, code=code)
