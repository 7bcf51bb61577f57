"""The parts without a network: lengths, objectives, durations, scenarios, percentiles,
the SSE reader, and the names shared with the gateway."""

from __future__ import annotations

import random
from array import array
from pathlib import Path

import pytest

from sluicegate import wire
from sluicegate.bench.distributions import parse_lengths
from sluicegate.bench.scenarios import load_scenarios_file, parse_scenario_flag
from sluicegate.bench.slo import parse_slo
from sluicegate.bench.spec import PRIORITY_HEADER, SCENARIO_HEADER, BenchSpec, SpecError
from sluicegate.bench.sse import StreamReader
from sluicegate.bench.stats import percentile, summary
from sluicegate.bench.units import parse_fraction, parse_seconds


def test_header_names_are_the_gateways() -> None:
    assert PRIORITY_HEADER == wire.PRIORITY_HEADER
    assert SCENARIO_HEADER == wire.SCENARIO_HEADER


def test_durations_and_shares() -> None:
    assert parse_seconds("250ms") == pytest.approx(0.25)
    assert parse_seconds("2s") == 2.0
    assert parse_seconds("1.5m") == 90.0
    assert parse_seconds("1m30s") == 90.0
    assert parse_seconds("500us") == pytest.approx(0.0005)
    for bad in ("2", "", "2 s", "fast", "-1s"):
        with pytest.raises(ValueError):
            parse_seconds(bad)
    assert parse_fraction("0.1%") == pytest.approx(0.001)
    assert parse_fraction("0.02") == 0.02
    with pytest.raises(ValueError):
        parse_fraction("120%")


def test_lengths_parse_and_draw_within_their_bounds() -> None:
    rng = random.Random(1)
    assert parse_lengths("fixed:12").draw(rng) == 12
    uniform = parse_lengths("uniform:5-9")
    assert {uniform.draw(rng) for _ in range(200)} == set(range(5, 10))
    lognormal = parse_lengths("lognormal:mean=200,sigma=0.5")
    draws = [lognormal.draw(rng) for _ in range(20_000)]
    assert min(draws) >= 1
    assert 180 < sum(draws) / len(draws) < 220  # its mean is the given mean
    assert lognormal.text == "lognormal:mean=200,sigma=0.5"
    for bad in ("fixed:0", "uniform:9-5", "uniform:5", "lognormal:mean=10", "poisson:3", ""):
        with pytest.raises(ValueError, match="fixed:N"):
            parse_lengths(bad)


def test_slo_parses_and_names_the_bad_token() -> None:
    slo = parse_slo("ttft_p95=2s,tpot_p95=80ms,e2e_p99=30s,itl_p99=1.5m,error_rate=0.1%")
    assert slo.to_json() == {"ttft_p95": 2.0, "tpot_p95": 0.08, "e2e_p99": 30.0,
                             "itl_p99": 90.0, "error_rate": 0.001}  # fmt: skip
    assert slo.per_request_limits() == {"ttft": 2.0, "tpot": 0.08, "e2e": 30.0}
    with pytest.raises(ValueError, match="'ttft_p97=2s'"):
        parse_slo("ttft_p95=2s,ttft_p97=2s")
    with pytest.raises(ValueError, match="'tpot_p95=80'"):
        parse_slo("tpot_p95=80")
    with pytest.raises(ValueError, match="'error_rate=lots'"):
        parse_slo("error_rate=lots")
    figures = {"ttft": {"p95": 1.0}, "tpot": {"p95": 0.1}, "e2e": {"p99": None},
               "itl": {"p99": 0.0}, "error_rate": 0.0}  # fmt: skip
    met = {c["objective"]: c["met"] for c in slo.check(figures)}
    assert met == {"ttft_p95": True, "tpot_p95": False, "e2e_p99": False, "itl_p99": True,
                   "error_rate": True}  # fmt: skip


def test_percentiles_interpolate_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0
    figures = summary([3.0, 1.0, 2.0])
    assert figures["unit"] == "s"
    assert (figures["p50"], figures["max"], figures["mean"], figures["count"]) == (2.0, 3.0, 2.0, 3)
    assert summary([])["p99"] is None


def test_scenario_flags_keep_commas_of_a_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENANT_A_KEY", "sk-a")
    scenario = parse_scenario_flag(
        "name=qa,share=3,input=uniform:20-200,output=lognormal:mean=150,sigma=0.6,"
        "key-env=TENANT_A_KEY,priority=interactive"
    )
    assert scenario.name == "qa" and scenario.share == 3.0
    assert scenario.output_lengths is not None
    assert scenario.output_lengths.text == "lognormal:mean=150,sigma=0.6"
    assert scenario.key is not None and scenario.key.reveal() == "sk-a"
    assert "sk-a" not in repr(scenario) and "sk-a" not in str(scenario.parameters())
    with pytest.raises(SpecError, match="never given inline"):
        parse_scenario_flag("name=qa,key=sk-inline")
    with pytest.raises(SpecError, match="unknown field 'colour'"):
        parse_scenario_flag("name=qa,colour=red")
    with pytest.raises(SpecError, match="UNSET_KEY_VAR"):
        parse_scenario_flag("name=qa,key-env=UNSET_KEY_VAR")


def test_scenarios_file(tmp_path: Path) -> None:
    (tmp_path / "b.key").write_text("sk-b\n")
    (tmp_path / "long.jsonl").write_text('{"prompt": "write a lot", "max_tokens": 9}\n')
    path = tmp_path / "scenarios.yaml"
    path.write_text(
        "scenarios:\n"
        "  - {name: qa, share: 3, input: 'uniform:10-20', priority: interactive}\n"
        "  - {name: long, share: 1, prompts: long.jsonl, key_file: b.key, priority: batch}\n"
    )
    qa, long = load_scenarios_file(path)
    assert qa.share == 3 and qa.priority == "interactive"
    assert long.key is not None and long.key.reveal() == "sk-b"
    path.write_text("- {name: qa, api_key: sk-no}\n")
    with pytest.raises(SpecError, match="never in the file"):
        load_scenarios_file(path)


def test_spec_checks_name_the_flag() -> None:
    cases = {
        "--concurrency": {"url": "http://x", "duration_s": 1.0},
        "--duration": {"url": "http://x", "rate": 1.0},
        "--url": {"url": "x:1", "rate": 1.0, "duration_s": 1.0},
        "--slo": {"url": "http://x", "rate": 1.0, "duration_s": 1.0, "slo": "ttft=1s"},
        "--sweep": {"url": "http://x", "rate": 1.0, "duration_s": 1.0, "sweep": True},
        "--ramp": {"url": "http://x", "rate": 1.0, "requests": 5, "ramp": (1.0, 2.0)},
        "--input-tokens": {"url": "http://x", "rate": 1.0, "requests": 5,
                           "input_tokens": "many"},
    }  # fmt: skip
    for flag, fields in cases.items():
        with pytest.raises(SpecError) as caught:
            BenchSpec(**fields)  # type: ignore[arg-type]
        assert caught.value.flag == flag, (flag, caught.value)


def test_spec_never_shows_its_key() -> None:
    spec = BenchSpec(url="http://x", api_key="sk-hidden-1", rate=1.0, requests=1)
    assert "sk-hidden-1" not in repr(spec)
    assert "sk-hidden-1" not in str(spec.parameters())
    assert spec.key is not None and spec.key.reveal() == "sk-hidden-1"


def test_sse_reader_times_content_events_split_anywhere() -> None:
    events = (
        b": keep-alive\n\n"
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":9}}\n\n'
        b"data: [DONE]\n\n"
    )
    for step in (1, 7, len(events)):
        reader = StreamReader()
        for index, start in enumerate(range(0, len(events), step)):
            reader.feed(events[start : start + step], float(index))
        assert reader.content_events == 3  # the empty first delta is not content
        assert reader.completion_tokens == 9 and reader.prompt_tokens == 4
        assert reader.done
        assert len(reader.gaps) == 2
    crlf = StreamReader()
    text = b'data: {"choices":[{"text":"x"}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    for index, byte in enumerate(text):
        crlf.feed(bytes([byte]), float(index))
    assert crlf.content_events == 1 and crlf.done
    error = StreamReader()
    error.feed(b'data: {"error":{"message":"boom","code":"overloaded"}}\n\n', 1.0)
    assert error.error_code == "overloaded"
    assert isinstance(StreamReader().gaps, array)
