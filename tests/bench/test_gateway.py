"""Through a real gateway (`sluicegate up` on the quickstart, real Envoy): the bench's
counts match what the mock behind it was told to send, with a tenant key and a priority."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sluicegate.bench import BenchSpec, Scenario, run_bench
from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import running_stack

pytestmark = pytest.mark.e2e

DEMO_KEY = "sk-sluicegate-demo"  # examples/quickstart.yaml's tenant `demo`


@pytest.fixture
def gateway(tmp_path: Path) -> Any:
    with running_stack(tmp_path, quickstart_on_free_ports(tmp_path)) as stack:
        yield stack


async def test_streams_and_json_answers_through_the_gateway(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCH_DEMO_KEY", DEMO_KEY)
    # qwen-plus is served by mock alpha: 24 tokens, the first after 60 ms.
    batch = Scenario("bulk", priority="batch", key_env="BENCH_DEMO_KEY")
    streamed = BenchSpec(url=gateway.gateway, model="qwen-plus", concurrency=2, requests=12,
                         input_tokens="fixed:32", scenarios=(batch,), processes=1)  # fmt: skip
    figures = (await run_bench(streamed)).to_json()
    assert figures["requests"]["ok"] == 12, figures["errors"]
    assert figures["output_tokens"] == 12 * 24
    assert figures["itl"]["count"] == 12 * 23
    assert figures["ttft"]["min"] > 0.060
    assert set(figures["priorities"]) == {"batch"}
    answers = BenchSpec(url=gateway.gateway, api_key=os.environ["BENCH_DEMO_KEY"],
                        model="qwen-plus", concurrency=2, requests=6, stream=False,
                        output_tokens="fixed:10", processes=1)  # fmt: skip
    figures = (await run_bench(answers)).to_json()
    assert figures["requests"]["ok"] == 6, figures["errors"]
    assert figures["output_tokens"] == 6 * 10
    assert figures["e2e"]["min"] > 0.060 + 9 * 0.010
    refused = BenchSpec(url=gateway.gateway, api_key="sk-not-a-tenant", model="qwen-plus",
                        concurrency=1, requests=3, processes=1)  # fmt: skip
    figures = (await run_bench(refused)).to_json()
    assert figures["errors"]["by_status"] == {"401": 3}
    assert figures["errors"]["by_code"] == {"invalid_api_key": 3}


async def test_the_gateways_refusals_and_queue_times_are_seen_as_such(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through sluicegate's admission: a request over the tenant's token limit is the
    gateway's refusal (x-sluicegate-refusal), not an error, and every admitted answer
    reports its queue time (x-sluicegate-queue-ms)."""
    # The demo tenant may reserve 100,000 tokens a minute: asking 30,000 each, four at
    # once, three fit and the fourth is refused until the window frees (Retry-After).
    # gpt-4o-mini's route has a gate, so the routing stage admits the demo tenant's
    # requests for it (it is `lane: auto`: docs/fast-lane.md).
    burst = BenchSpec(url=gateway.gateway, api_key=DEMO_KEY, model="gpt-4o-mini",
                      concurrency=4, requests=4, output_tokens="fixed:30000",
                      processes=1)  # fmt: skip
    figures = (await run_bench(burst)).to_json()
    assert figures["requests"]["ok"] == 3, figures
    assert figures["errors"]["total"] == 0, figures["errors"]
    assert figures["refusals"]["by_code"] == {"rate_limit_exceeded": 1}
    assert figures["refusals"]["retry_after"]["min"] >= 1
    assert figures["queue"]["count"] == 3  # every admitted answer said how long it queued
    # One alone over the whole limit: refused at once, and told not to retry.
    alone = BenchSpec(url=gateway.gateway, api_key=DEMO_KEY, model="gpt-4o-mini",
                      concurrency=1, requests=1, output_tokens="fixed:200000",
                      processes=1)  # fmt: skip
    figures = (await run_bench(alone)).to_json()
    assert figures["refusals"]["by_code"] == {"request_too_large": 1}
