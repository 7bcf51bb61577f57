"""Tiered timeouts, end to end: each fires where docs/resilience.md ("Timeouts: what fires
when") says, with its own error code, and none of them cuts a stream that keeps producing tokens.

One stack, one route per timeout under test (route-level overrides of `defaults:`),
retries off where a single attempt is being timed. The >15 s stream is the slow test
here: it proves Envoy's 15 s route-timeout default is not in force.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from sluicegate.provider.thread import ThreadedMockProvider
from tests.e2e.stack import Stack

from .harness import HELLO, Blackhole, client, closed_port, document, gateway, mock, post, stats

pytestmark = pytest.mark.e2e

NO_RETRIES = {"max_retries": 0}


@dataclass
class Setup:
    stack: Stack
    gen: ThreadedMockProvider


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp: Path = tmp_path_factory.mktemp("timeouts")
    hole = Blackhole()
    with closing(hole), closing(mock("gen")) as gen:
        url = f"http://127.0.0.1:{gen.port}/v1"
        providers = [
            {"name": "gen", "base_url": url},
            {"name": "hole", "base_url": f"http://127.0.0.1:{hole.port}/v1"},
            {"name": "refused", "base_url": f"http://127.0.0.1:{closed_port()}/v1"},
        ]

        def route(name: str, provider: str = "gen", **overrides: Any) -> dict[str, Any]:
            return {"name": name, "models": [name], "backends": [{"provider": provider}],
                    **overrides}  # fmt: skip

        routes = [
            route("defaults"),  # nothing overridden
            route("first-byte",
                  timeouts={"first_byte": "500ms", "first_token": "500ms", "idle": "5s"},
                  retries=NO_RETRIES),
            route("idle", timeouts={"first_byte": 0, "idle": "500ms"}, retries=NO_RETRIES),
            route("total", timeouts={"total": "1s"}, retries=NO_RETRIES),
            route("connect", "hole", timeouts={"connect": "300ms"}, retries=NO_RETRIES),
            route("refused", "refused", retries=NO_RETRIES),
        ]  # fmt: skip
        with gateway(tmp, document(providers, routes)) as stack:
            yield Setup(stack, gen)


def stream(stack: Stack, model: str, **mock_headers: int) -> tuple[list[str], float]:
    """Content pieces of a streamed completion and the seconds it took."""
    headers = {f"x-mock-{name.replace('_', '-')}": str(v) for name, v in mock_headers.items()}
    started = time.monotonic()
    chunks = client(stack).chat.completions.create(
        model=model, messages=HELLO, stream=True, extra_headers=headers
    )
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    return pieces, time.monotonic() - started


def cut_stream(stack: Stack, model: str, **mock_headers: int) -> tuple[list[str], float, Exception]:
    """A stream that is expected to break: the pieces before, the time, the exception."""
    headers = {f"x-mock-{name.replace('_', '-')}": str(v) for name, v in mock_headers.items()}
    pieces: list[str] = []
    started = time.monotonic()
    chunks = client(stack).chat.completions.create(
        model=model, messages=HELLO, stream=True, extra_headers=headers
    )
    try:
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
    except Exception as exc:  # what the SDK raises is the point of the test
        return pieces, time.monotonic() - started, exc
    raise AssertionError(f"the stream was not cut ({len(pieces)} pieces)")


def test_long_stream_outlives_envoys_15s_default(setup: Setup) -> None:
    """80 tokens 200 ms apart: 16 s of steady output, with the default timeouts."""
    pieces, seconds = stream(setup.stack, "defaults", output_tokens=80, itl_ms=200, ttft_ms=50)
    assert len(pieces) == 80
    assert seconds > 15.5


def test_first_byte_timeout_is_a_distinct_504(setup: Setup) -> None:
    answer = post(setup.stack, "first-byte", {"x-mock-ttft-ms": "2000"})
    assert answer.status == 504, answer.body
    assert answer.body["error"]["code"] == "upstream_timeout"
    assert "first_byte" in answer.body["error"]["message"]
    assert 0.45 < answer.seconds < 1.5
    assert stats(setup.stack, "route-first-byte")["upstream_rq_per_try_timeout"] >= 1


def test_first_token_timeout_never_cuts_a_started_stream(setup: Setup) -> None:
    """first_token (a stream's first_byte) 500 ms; the stream lasts 2 s after its first
    token, and completes."""
    pieces, seconds = stream(setup.stack, "first-byte", output_tokens=10, itl_ms=200, ttft_ms=50)
    assert len(pieces) == 10
    assert seconds > 1.8


def test_idle_timeout_before_the_first_byte(setup: Setup) -> None:
    answer = post(setup.stack, "idle", {"x-mock-ttft-ms": "2000"})
    assert answer.status == 504, answer.body
    assert answer.body["error"]["code"] == "upstream_idle_timeout"
    assert 0.45 < answer.seconds < 1.5


def test_idle_timeout_restarts_on_every_chunk(setup: Setup) -> None:
    """idle 500 ms; chunks 300 ms apart for 2.4 s: never idle long enough to fire."""
    pieces, seconds = stream(setup.stack, "idle", output_tokens=8, itl_ms=300, ttft_ms=50)
    assert len(pieces) == 8
    assert seconds > 2.0


def test_idle_timeout_mid_stream_ends_it_so_the_sdk_raises(setup: Setup) -> None:
    before = stats(setup.stack, "route-idle").get("upstream_rq_per_try_idle_timeout", 0)
    pieces, seconds, error = cut_stream(
        setup.stack, "idle", output_tokens=5, itl_ms=3000, ttft_ms=50
    )
    assert len(pieces) == 1  # the first token came, the second would take 3 s
    assert seconds < 2.5
    assert _is_broken_stream(error), repr(error)
    assert stats(setup.stack, "route-idle")["upstream_rq_per_try_idle_timeout"] == before + 1


def test_total_deadline_before_the_first_byte(setup: Setup) -> None:
    answer = post(setup.stack, "total", {"x-mock-ttft-ms": "3000"})
    assert answer.status == 504, answer.body
    assert answer.body["error"]["code"] == "deadline_exceeded"
    assert 0.95 < answer.seconds < 2.0


def test_total_deadline_cuts_even_a_healthy_stream(setup: Setup) -> None:
    pieces, seconds, error = cut_stream(
        setup.stack, "total", output_tokens=20, itl_ms=200, ttft_ms=50
    )
    assert 3 <= len(pieces) < 20
    assert seconds < 3.0
    assert _is_broken_stream(error), repr(error)


def test_connect_timeout_is_a_distinct_503(setup: Setup) -> None:
    answer = post(setup.stack, "connect")
    assert answer.status == 503, answer.body
    assert answer.body["error"]["code"] == "upstream_connect_timeout"
    assert 0.25 < answer.seconds < 1.5
    assert stats(setup.stack, "route-connect")["upstream_cx_connect_timeout"] >= 1


def test_connection_refused_is_a_distinct_503(setup: Setup) -> None:
    answer = post(setup.stack, "refused")
    assert answer.status == 503, answer.body
    assert answer.body["error"]["code"] == "upstream_connect_error"
    assert "Connection_refused" in answer.body["error"]["message"]


def _is_broken_stream(error: Exception) -> bool:
    """What the OpenAI SDK raises when Envoy ends a started stream: the HTTP/1.1 chunked
    body stops without its last chunk, the HTTP client reports "peer closed connection
    without sending complete message body (incomplete chunked read)" and the SDK raises
    APIConnectionError from it. No `data: [DONE]` arrived, so the client also knows."""
    return isinstance(error, openai.APIConnectionError) and "incomplete chunked read" in str(
        error.__cause__
    )
