"""`sluicegate drain`: traffic moves off a provider with zero failed requests."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import Stack, running_stack

pytestmark = pytest.mark.e2e

HELLO: Any = [{"role": "user", "content": "hello"}]
QUICK = {"x-mock-output-tokens": "1", "x-mock-ttft-ms": "0"}


def drain(stack: Stack, provider: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluicegate", "drain", provider,
         "--address", stack.doc["sluicegate"]["http"], *flags],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def provider_of(sdk: OpenAI, model: str) -> str:
    raw = sdk.chat.completions.with_raw_response.create(
        model=model, messages=HELLO, extra_headers=QUICK
    )
    return raw.headers["x-mock-provider"]


def test_drain_moves_traffic_without_failures(tmp_path: Path) -> None:
    with running_stack(tmp_path, quickstart_on_free_ports(tmp_path)) as stack:
        sdk = OpenAI(base_url=stack.gateway + "/v1", api_key="sk-sluicegate-demo", max_retries=0)
        assert provider_of(sdk, "deepseek-chat") == "beta"  # beta is deepseek's priority 0

        # A stream in flight on beta must finish after beta is drained.
        tokens: list[int] = []

        def long_stream() -> None:
            stream = sdk.chat.completions.create(
                model="deepseek-chat", messages=HELLO, stream=True,
                extra_headers={"x-mock-output-tokens": "40", "x-mock-itl-ms": "25"},
            )  # fmt: skip
            tokens.append(sum(1 for c in stream if c.choices and c.choices[0].delta.content))

        # Steady traffic on a two-provider model while the drain happens.
        stop = threading.Event()
        outcomes: list[str] = []

        def steady() -> None:
            while not stop.is_set():
                try:
                    outcomes.append(provider_of(sdk, "gpt-4o-mini"))
                except Exception as err:  # any failure is what this test is about
                    outcomes.append(f"error: {err!r}")

        workers = [threading.Thread(target=long_stream)]
        workers += [threading.Thread(target=steady) for _ in range(3)]
        for worker in workers:
            worker.start()
        time.sleep(0.3)
        result = drain(stack, "beta")
        assert result.returncode == 0, result.stderr
        assert "beta" in result.stdout

        deadline = time.monotonic() + 10
        while provider_of(sdk, "deepseek-chat") != "alpha":
            assert time.monotonic() < deadline, "deepseek-chat never moved to alpha"
            time.sleep(0.05)
        drained_at = len(outcomes)
        time.sleep(0.5)
        stop.set()
        for worker in workers:
            worker.join(20)

        assert tokens == [40], "the stream in flight on the drained provider was cut"
        errors = [o for o in outcomes if o.startswith("error")]
        assert not errors, errors[:3]
        assert len(outcomes) > 20
        assert set(outcomes[drained_at:]) == {"alpha"}  # nothing new reaches beta
        assert stack.status()["drained"] == ["beta"]

        result = drain(stack, "beta", "--undo")
        assert result.returncode == 0, result.stderr
        deadline = time.monotonic() + 10
        while provider_of(sdk, "deepseek-chat") != "beta":
            assert time.monotonic() < deadline, "beta did not come back"
            time.sleep(0.05)

        unknown = drain(stack, "gamma")
        assert unknown.returncode == 1 and "unknown provider" in unknown.stderr
