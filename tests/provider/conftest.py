"""Fixtures: mock providers on free ports, closed at the end of every test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from openai import AsyncOpenAI

from sluicegate.provider import MockProviderSettings, RunningMockProvider, start_mock_provider

StartProvider = Callable[..., Awaitable[RunningMockProvider]]

API_KEY = "sk-test-provider"


@pytest.fixture
async def start_provider() -> AsyncIterator[StartProvider]:
    """`await start_provider(name="alpha", ttft_ms=...)` -> a running provider on a free port."""
    started: list[RunningMockProvider] = []

    async def start(**overrides: Any) -> RunningMockProvider:
        fields: dict[str, Any] = {"ttft_ms": 1.0, "itl_ms": 1.0, "output_tokens": 4}
        fields.update(overrides)
        provider = await start_mock_provider(MockProviderSettings(**fields))
        started.append(provider)
        return provider

    yield start
    for provider in started:
        await provider.close()


@pytest.fixture
async def provider(start_provider: StartProvider) -> RunningMockProvider:
    return await start_provider(name="alpha", api_key=API_KEY, models=["gpt-4o-mini", "m2"])


@pytest.fixture
async def client(provider: RunningMockProvider) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=provider.url + "/v1", api_key=API_KEY, max_retries=0, timeout=5.0
    ) as openai_client:
        yield openai_client


def user(text: str = "hello there") -> list[Any]:
    return [{"role": "user", "content": text}]
