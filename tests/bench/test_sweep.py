"""`--sweep` finds the capacity of an upstream that refuses above a concurrency: with a
closed loop of N <= K slots it never sees more than K requests, and with N > K it refuses
some, so the answer does not depend on timing."""

from __future__ import annotations

from typing import Any

from sluicegate.bench import BenchSpec, run_bench


async def test_sweep_finds_the_concurrency_limit(start_upstream: Any) -> None:
    upstream = start_upstream(latency_ms=15, max_inflight=5)
    spec = BenchSpec(url=upstream.url, stream=False, concurrency=1, requests=40, sweep=True,
                     slo="error_rate=0.1%", processes=1)  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    loads = [step["load"]["value"] for step in figures["steps"]]
    assert loads == [1, 2, 4, 8, 6, 5]  # doubling until 8 fails, then bisecting
    assert [step["slo"]["met"] for step in figures["steps"]] == [True, True, True, False,
                                                                   False, True]  # fmt: skip
    assert figures["capacity"] == {"shape": "closed", "unit": "concurrency", "value": 5,
                                   "requests_per_s": figures["requests_per_s"], "met": True,
                                   "bounded": True}
    assert figures["load"]["value"] == 5  # the top-level figures are the capacity step's
    assert figures["steps"][3]["errors"]["by_code"]["rate_limit_exceeded"] > 0
    assert "timeline" not in figures["steps"][0] and figures["timeline"]["points"]


async def test_sweep_says_when_even_the_start_fails(start_upstream: Any) -> None:
    upstream = start_upstream(latency_ms=15, max_inflight=1)
    spec = BenchSpec(url=upstream.url, stream=False, concurrency=3, requests=30, sweep=True,
                     slo="error_rate=0%", processes=1)  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    assert len(figures["steps"]) == 1
    assert figures["capacity"]["value"] is None and figures["capacity"]["met"] is False


async def test_open_loop_sweep_grows_then_bisects_to_the_resolution(start_upstream: Any) -> None:
    upstream = start_upstream()
    spec = BenchSpec(url=upstream.url, stream=False, rate=50.0, duration_s=0.3, sweep=True,
                     sweep_steps=3, slo="error_rate=0%", processes=1)  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    assert [step["load"]["value"] for step in figures["steps"]] == [50.0, 100.0, 200.0]
    assert figures["capacity"]["value"] == 200.0  # every step met it; --sweep-steps bound
    assert figures["capacity"]["bounded"] is False  # so 200 is a lower bound, and says so
