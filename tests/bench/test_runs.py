"""Runs against a real mock provider: counts the bench must get exactly, and times it can
only bound from below (no timed assertion has an upper bound)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluicegate.bench import BenchSpec, Scenario, SpecError, run_bench
from sluicegate.provider import MockProviderSettings, ThreadedMockProvider


async def test_streamed_run_counts_every_token(mock: ThreadedMockProvider) -> None:
    result = await run_bench(BenchSpec(url=mock.url, concurrency=3, requests=30, processes=1))
    figures = result.to_json()
    assert figures["parameters"]["model"] == "m1"  # the first of /v1/models
    assert figures["requests"] == {"measured": 30, "ok": 30, "failed": 0, "dropped": 0}
    assert figures["output_tokens"] == 30 * 7  # usage says 7 for each
    assert figures["itl"]["count"] == 30 * 6  # gaps between 7 content events
    assert figures["tpot"]["count"] == 30
    # The mock waits 20 ms before the first token, then 2 ms a token: lower bounds, less
    # the 1 ms its event loop's clock may be behind (uvloop's, in whole milliseconds).
    assert figures["ttft"]["p50"] > 0.020 - 0.001
    assert figures["e2e"]["min"] > 0.020 + 6 * 0.002 - 0.001
    assert figures["ttft"]["max"] <= figures["e2e"]["max"]
    chats = [r for r in mock.stats()["recent_requests"] if r["path"] == "/v1/chat/completions"]
    assert len(chats) == 30 and all(r["stream"] for r in chats)
    assert mock.stats()["requests_total"] == 31  # and GET /v1/models


async def test_usage_counted_from_content_events_when_not_asked(
    mock: ThreadedMockProvider,
) -> None:
    spec = BenchSpec(url=mock.url, model="m2", concurrency=2, requests=10, stream_usage=False,
                     processes=1)  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    assert figures["output_tokens"] == 10 * 7
    assert figures["parameters"]["model"] == "m2"


async def test_json_answers(mock: ThreadedMockProvider) -> None:
    spec = BenchSpec(url=mock.url, concurrency=2, requests=12, stream=False,
                     output_tokens="fixed:5", processes=1)  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    assert figures["requests"]["ok"] == 12
    assert figures["output_tokens"] == 12 * 5  # max_tokens 5 below the mock's 7
    assert figures["itl"]["count"] == 0 and figures["tpot"]["count"] == 0
    assert figures["ttft"]["p50"] == figures["e2e"]["p50"]  # all content comes at once
    assert figures["e2e"]["min"] > 0.020 + 4 * 0.002 - 0.001  # the mock's clock, as above


async def test_open_loop_sends_about_rate_times_duration(mock: ThreadedMockProvider) -> None:
    spec = BenchSpec(url=mock.url, rate=40.0, duration_s=2.0, processes=1, seed=3)
    figures = (await run_bench(spec)).to_json()
    assert 40 <= figures["requests"]["measured"] <= 130  # Poisson: 80 expected
    assert figures["requests"]["ok"] == figures["requests"]["measured"]
    assert figures["client"]["schedule_lag"]["count"] == figures["requests"]["measured"]


async def test_requests_excludes_the_warmup(mock: ThreadedMockProvider) -> None:
    spec = BenchSpec(url=mock.url, concurrency=2, requests=8, warmup_s=0.3, processes=1)
    result = await run_bench(spec)
    assert result.to_json()["requests"]["measured"] == 8
    assert mock.stats()["requests_total"] > 8 + 1  # the warm-up's and GET /v1/models


async def test_errors_by_status_and_code() -> None:
    settings = MockProviderSettings(ttft_ms=1, itl_ms=1, output_tokens=2, rate_429=0.3,
                                    rate_500=0.3, seed=5)  # fmt: skip
    with ThreadedMockProvider(settings) as provider:
        spec = BenchSpec(url=provider.url, model="m", concurrency=4, requests=200,
                         processes=1, slo="error_rate=1%")  # fmt: skip
        figures = (await run_bench(spec)).to_json()
    errors = figures["errors"]
    assert set(errors["by_status"]) == {"429", "500"}
    assert errors["by_code"]["rate_limit_exceeded"] == errors["by_status"]["429"]
    assert errors["total"] == figures["requests"]["failed"] > 0
    assert figures["refusals"]["total"] == 0  # the provider's 429s are not the gateway's
    assert figures["error_rate"] == errors["total"] / 200
    assert figures["slo"]["met"] is False
    assert figures["goodput"]["requests"] == figures["requests"]["ok"]


async def test_connection_errors_and_timeouts_are_kinds_of_their_own() -> None:
    settings = MockProviderSettings(ttft_ms=1, itl_ms=1, output_tokens=2, rate_reset=0.5,
                                    rate_hang=0.2, seed=11)  # fmt: skip
    with ThreadedMockProvider(settings) as provider:
        spec = BenchSpec(url=provider.url, model="m", concurrency=4, requests=40,
                         timeout_s=0.3, processes=1)  # fmt: skip
        figures = (await run_bench(spec)).to_json()
    kinds = figures["errors"]["by_kind"]
    assert kinds["connection"] > 0 and kinds["timeout"] > 0
    assert figures["errors"]["connection"] == kinds["connection"]
    assert figures["errors"]["timeout"] == kinds["timeout"]
    assert figures["requests"]["measured"] == 40


async def test_scenarios_split_the_figures(mock: ThreadedMockProvider, tmp_path: Path) -> None:
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 3}) + "\n")  # fmt: skip
    spec = BenchSpec(
        url=mock.url, concurrency=4, requests=120, processes=1,
        scenarios=(Scenario("qa", share=3, input_tokens="uniform:5-20", priority="interactive"),
                   Scenario("long", share=1, prompts=prompts, priority="batch")),
    )  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    qa, long = figures["scenarios"]["qa"], figures["scenarios"]["long"]
    assert qa["requests"]["measured"] + long["requests"]["measured"] == 120
    assert qa["requests"]["measured"] > long["requests"]["measured"] > 0  # shares 3:1
    assert long["output_tokens"] == 3 * long["requests"]["ok"]  # the line's max_tokens
    assert figures["priorities"]["batch"]["requests"] == long["requests"]
    headers = [r["headers"] for r in mock.stats()["recent_requests"]]
    assert {h.get("x-sluicegate-scenario") for h in headers} == {"qa", "long"}
    assert {h.get("x-sluicegate-priority") for h in headers} == {"interactive", "batch"}


async def test_worker_processes_share_the_load(start_upstream: Any) -> None:
    upstream = start_upstream(latency_ms=1)
    spec = BenchSpec(url=upstream.url, stream=False, concurrency=5, requests=50, processes=2)
    figures = (await run_bench(spec)).to_json()
    assert figures["requests"]["measured"] == 50 and figures["requests"]["ok"] == 50
    assert figures["client"]["processes"] == 2
    assert figures["output_tokens"] == 50 * 16


async def test_ramps(start_upstream: Any) -> None:
    upstream = start_upstream(latency_ms=5)
    rising = BenchSpec(url=upstream.url, stream=False, rate=1.0, ramp=(0.0, 80.0),
                       duration_s=1.0, processes=1, seed=7)  # fmt: skip
    figures = (await run_bench(rising)).to_json()
    points = figures["timeline"]["points"]
    first = sum(p["sent"] for p in points if p["t"] < 0.5)
    second = sum(p["sent"] for p in points if p["t"] >= 0.5)
    assert second > first  # arrival times come from the seed: the same every run
    slots = BenchSpec(url=upstream.url, stream=False, concurrency=1, ramp=(1.0, 4.0),
                      duration_s=0.6, processes=1)  # fmt: skip
    assert (await run_bench(slots)).to_json()["requests"]["ok"] > 0


async def test_a_ramp_from_zero_sends_what_its_rates_add_up_to(start_upstream: Any) -> None:
    """A rate rising slowly from 0 to 30/s over 2 s makes about 30 arrivals (its mean
    rate times its length). Drawing each gap at the previous arrival's rate waited about
    7 s for the first: next to none."""
    upstream = start_upstream(latency_ms=1)
    sent = 0
    for seed in range(3):  # one lucky seed proves nothing
        spec = BenchSpec(url=upstream.url, stream=False, rate=1.0, ramp=(0.0, 30.0),
                         duration_s=2.0, processes=1, seed=seed)  # fmt: skip
        figures = (await run_bench(spec)).to_json()
        sent += figures["requests"]["measured"] + figures["requests"]["dropped"]
    assert 3 * 18 <= sent <= 3 * 45


async def test_open_loop_drops_what_max_inflight_does_not_allow(start_upstream: Any) -> None:
    upstream = start_upstream(latency_ms=100)
    spec = BenchSpec(url=upstream.url, stream=False, rate=200.0, duration_s=0.5,
                     max_inflight=2, processes=1, seed=1)  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    assert figures["requests"]["dropped"] > 0
    assert figures["requests"]["measured"] + figures["requests"]["dropped"] > 50


async def test_dropped_arrivals_count_against_the_objectives(start_upstream: Any) -> None:
    """Every request that was sent succeeded, but most arrivals could not be sent: the
    error rate counts them and the SLO is missed, not met."""
    upstream = start_upstream(latency_ms=100)
    spec = BenchSpec(url=upstream.url, stream=False, rate=200.0, duration_s=0.5,
                     max_inflight=2, processes=1, seed=1, slo="error_rate=50%")  # fmt: skip
    figures = (await run_bench(spec)).to_json()
    assert figures["requests"]["failed"] == 0 and figures["requests"]["dropped"] > 0
    assert figures["error_rate"] > 0.5
    assert figures["slo"]["met"] is False
    assert {"objective": "dropped", "limit": 0, "value": figures["requests"]["dropped"],
            "met": False} in figures["slo"]["checks"]  # fmt: skip


async def test_prompt_file_lines(mock: ThreadedMockProvider, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "one", "max_tokens": 2, "temperature": 0}\n'
        "\n"
        '{"messages": [{"role": "user", "content": "two"}], "scenario": "chat"}\n'
    )
    spec = BenchSpec(url=mock.url, concurrency=1, requests=20, prompts=prompts, processes=1)
    figures = (await run_bench(spec)).to_json()
    assert set(figures["scenarios"]) == {"default", "chat"}  # a share per line
    chat, default = figures["scenarios"]["chat"], figures["scenarios"]["default"]
    assert default["output_tokens"] == 2 * default["requests"]["ok"]
    assert chat["output_tokens"] == 7 * chat["requests"]["ok"]  # no max_tokens: the mock's 7
    prompts.write_text('{"prompt": "one"}\n{"text": "no messages"}\n')
    with pytest.raises(SpecError, match=r"prompts.jsonl:2: needs messages"):
        await run_bench(spec)


async def test_fixed_upstream_streams_paced_chunks(start_upstream: Any) -> None:
    upstream = start_upstream(output_tokens=16, stream_chunks=4, chunk_interval_ms=3,
                              latency_ms=10)  # fmt: skip
    spec = BenchSpec(url=upstream.url, concurrency=2, requests=10, processes=1)
    figures = (await run_bench(spec)).to_json()
    assert figures["output_tokens"] == 10 * 16  # from its usage event
    assert figures["itl"]["count"] == 10 * 3
    assert figures["ttft"]["min"] > 0.010 and figures["e2e"]["min"] > 0.010 + 3 * 0.003
    unasked = BenchSpec(url=upstream.url, concurrency=2, requests=4, stream_usage=False,
                        processes=1)  # fmt: skip
    assert (await run_bench(unasked)).to_json()["output_tokens"] == 4 * 4  # 4 events each
