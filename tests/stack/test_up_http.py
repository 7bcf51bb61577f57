"""`up`'s /status asks its two children at once, each briefly: a hung child or one that
answers garbage is shown as not answering, and the other's answer is kept."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from aiohttp import web

from sluicegate.stack.http_site import serve_app
from sluicegate.stack.up_http import ChildEndpoint, make_up_app
from tests.ports import free_port


async def answering(tmp_path: Path, name: str, body: bytes) -> tuple[str, web.AppRunner]:
    async def status(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/status", status)
    address = f"unix:{tmp_path / name}"
    return address, await serve_app(app, address)


async def get_status(cp: str, ext_proc: str) -> dict[str, object]:
    processes = [{"kind": "control_plane", "name": "xds", "state": "up"}]
    address = f"127.0.0.1:{free_port()}"
    runner = await serve_app(
        make_up_app(ChildEndpoint(cp), ChildEndpoint(ext_proc), lambda: processes), address
    )
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{address}/status") as response,
        ):
            assert response.status == 200
            document: dict[str, object] = await response.json()
            return document
    finally:
        await runner.cleanup()


async def test_a_hung_control_plane_is_named_and_admission_still_shown(
    tmp_path: Path, hung_socket: str
) -> None:
    admission = json.dumps({"admission": {"gates": []}}).encode()
    ext_proc, runner = await answering(tmp_path, "ext-proc.sock", admission)
    try:
        document = await get_status(hung_socket, ext_proc)
    finally:
        await runner.cleanup()
    assert document["control_plane"] == "not answering"
    assert document["admission"] == {"gates": []}
    assert "ext_proc" not in document


async def test_a_garbled_answer_counts_as_not_answering(tmp_path: Path, hung_socket: str) -> None:
    cp, runner = await answering(tmp_path, "cp.sock", b'{"last_reload": ')
    try:
        assert await ChildEndpoint(cp).json("/status") is None
        document = await get_status(cp, hung_socket)
    finally:
        await runner.cleanup()
    assert document["control_plane"] == "not answering"
    assert document["ext_proc"] == "not answering" and document["admission"] is None
