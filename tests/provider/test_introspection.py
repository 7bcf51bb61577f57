"""GET /mock/stats, POST /mock/reset and the in-process accessors."""

from __future__ import annotations

from typing import Any

import aiohttp

from sluicegate.provider import RunningMockProvider
from tests.provider.conftest import API_KEY, StartProvider, user

CHAT = "/v1/chat/completions"


async def _get_stats(
    session: aiohttp.ClientSession, provider: RunningMockProvider
) -> dict[str, Any]:
    async with session.get(provider.url + "/mock/stats") as response:
        assert response.status == 200
        stats: dict[str, Any] = await response.json()
        return stats


async def test_keep_alive_reuses_one_connection(provider: RunningMockProvider) -> None:
    body = {"model": "gpt-4o-mini", "messages": user()}
    headers = {"Authorization": f"Bearer {API_KEY}", "x-request-id": "abc"}
    async with aiohttp.ClientSession(headers=headers) as session:
        for _ in range(5):
            async with session.post(provider.url + CHAT, json=body) as response:
                assert response.status == 200
                await response.read()
        stats = await _get_stats(session, provider)
    assert stats["name"] == "alpha"
    assert stats["requests_total"] == 5  # /mock/* is not counted
    assert stats["by_status"] == {"200": 5}
    assert stats["by_model"] == {"gpt-4o-mini": 5}
    assert stats["connections_total"] == 1
    last = stats["last_request"]
    assert last["model"] == "gpt-4o-mini"
    assert last["path"] == CHAT
    assert last["authorization_present"] is True
    assert last["headers"]["x-request-id"] == "abc"
    assert "authorization" not in last["headers"]
    assert API_KEY not in str(stats)


async def test_new_connection_per_request_is_counted(provider: RunningMockProvider) -> None:
    body = {"model": "m2", "messages": user()}
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {API_KEY}"}, connector=connector
    ) as session:
        for _ in range(3):
            async with session.post(provider.url + CHAT, json=body) as response:
                await response.read()
    stats = provider.stats()
    assert stats["connections_total"] == 3
    assert stats["requests_total"] == 3


async def test_reset_zeroes_counters(provider: RunningMockProvider) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(provider.url + "/v1/models") as response:
            assert response.status == 401  # no key
        assert (await _get_stats(session, provider))["requests_total"] == 1
        async with session.post(provider.url + "/mock/reset") as response:
            assert response.status == 200
        stats = await _get_stats(session, provider)
    assert stats["requests_total"] == 0
    assert stats["connections_total"] == 0
    assert stats["by_status"] == {}
    assert stats["last_request"] is None


async def test_unauthenticated_request_is_recorded(start_provider: StartProvider) -> None:
    provider = await start_provider(name="beta")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            provider.url + CHAT, json={"model": "mapped-model", "messages": user()}
        ) as response,
    ):
        assert response.status == 200
    last = provider.stats()["last_request"]
    assert last["authorization_present"] is False
    assert last["model"] == "mapped-model"


async def test_healthz_and_config_need_no_auth(provider: RunningMockProvider) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(provider.url + "/healthz") as response:
            assert await response.json() == {"status": "ok", "name": "alpha"}
        async with session.get(provider.url + "/mock/config") as response:
            config = await response.json()
    assert config["name"] == "alpha"
    assert config["api_key"] is None and config["api_key_set"] is True
    assert provider.stats()["requests_total"] == 0


def test_configure_in_process_validates() -> None:
    # RunningMockProvider.configure goes through the same validation as POST /mock/config.
    from sluicegate.provider import MockProviderSettings

    settings = MockProviderSettings(name="x")
    assert settings.with_changes({"itl_ms": 3, "models": "a, b"}).models == ["a", "b"]
