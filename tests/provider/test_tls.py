"""HTTPS when tls_cert/tls_key are set (a throwaway self-signed certificate)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.provider.conftest import StartProvider, user


def _self_signed(directory: Path) -> tuple[str, str]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return str(cert), str(key)


async def test_https_stream_and_reset(start_provider: StartProvider, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    provider = await start_provider(name="secure", tls_cert=cert, tls_key=key)
    assert provider.url.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=cert)
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
