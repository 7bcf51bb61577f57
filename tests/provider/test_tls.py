"""HTTPS when tls_cert/tls_key are set (a throwaway self-signed certificate)."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest

from sluicegate.provider import make_test_ca
from tests.provider.conftest import StartProvider, user


async def test_https_stream_and_reset(start_provider: StartProvider, tmp_path: Path) -> None:
    certs = make_test_ca(tmp_path, ["127.0.0.1"])
    provider = await start_provider(name="secure", tls_cert=str(certs.cert), tls_key=str(certs.key))
    assert provider.url.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=certs.ca)
    body = {"model": "m", "messages": user(), "stream": True}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        async with session.post(provider.url + "/v1/chat/completions", json=body) as response:
            assert response.headers["x-mock-provider"] == "secure"
            assert (await response.read()).endswith(b"data: [DONE]\n\n")
        with pytest.raises(aiohttp.ClientError):
            async with session.post(
                provider.url + "/v1/chat/completions", json=body, headers={"x-mock-fault": "reset"}
            ) as response:
                await response.read()
