"""Pure pieces: settings validation, fault choice, header parsing, SSE framing."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.provider import Fault, MockProviderSettings
from sluicegate.provider.faults import choose_fault, parse_overrides
from sluicegate.provider.generation import estimate_prompt_tokens
from sluicegate.provider.sse import ChunkEncoder


@pytest.mark.parametrize(
    "fields",
    [
        {"rate_429": 1.5},
        {"rate_429": 0.6, "rate_hang": 0.6},
        {"ttft_ms": -1.0},
        {"output_tokens": 0},
        {"port": 70000},
        {"tls_key": "k.pem"},
        {"name": ""},
    ],
)
def test_invalid_settings(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        MockProviderSettings(**fields)  # type: ignore[arg-type]


def test_with_changes_rejects_fixed_and_mistyped_fields() -> None:
    settings = MockProviderSettings()
    for changes in ({"name": "b"}, {"tls_cert": "x"}, {"itl_ms": True}, {"output_tokens": 1.5}):
        with pytest.raises(ValueError):
            settings.with_changes(changes)
    changed = settings.with_changes({"api_key": "sk-new", "seed": None, "rate_cut": 1})
    assert (changed.api_key, changed.rate_cut) == ("sk-new", 1.0)


def test_rates_pick_faults_in_proportion() -> None:
    settings = MockProviderSettings(rate_429=0.25, rate_reset=0.25)
    rng = random.Random(1)
    picks = [choose_fault(settings, None, rng) for _ in range(4000)]
    assert 800 < picks.count(Fault.RATE_LIMIT) < 1200
    assert 800 < picks.count(Fault.RESET) < 1200
    assert set(picks) == {Fault.NONE, Fault.RATE_LIMIT, Fault.RESET}
    assert choose_fault(settings, Fault.NONE, rng) is Fault.NONE


def test_overrides_respect_fault_provider() -> None:
    headers = {"x-mock-fault": "HANG", "x-mock-fault-provider": "beta", "x-mock-itl-ms": "3"}
    assert parse_overrides(headers, "beta").fault is Fault.HANG
    other = parse_overrides(headers, "alpha")
    # Only the fault is targeted; latency overrides apply to every provider.
    assert (other.fault, other.itl_ms) == (None, 3.0)
    for bad in ({"x-mock-fault": "boom"}, {"x-mock-ttft-ms": "-1"}, {"x-mock-ttft-ms": "nan"}):
        with pytest.raises(ValueError):
            parse_overrides(bad, "alpha")


def test_prompt_token_estimate() -> None:
    parts = [{"type": "text", "text": "abcd" * 3}, {"type": "image_url", "image_url": {}}]
    body = {"messages": [{"role": "system", "content": "abcd"}, {"role": "user", "content": parts}]}
    assert estimate_prompt_tokens(body) == 4
    assert estimate_prompt_tokens({"messages": []}) == 1


@settings(max_examples=60, deadline=None, database=None)
@given(model=st.text(), text=st.text(), include_usage=st.booleans())
def test_chunks_are_valid_sse_json(model: str, text: str, include_usage: bool) -> None:
    encoder = ChunkEncoder(
        completion_id="c1",
        object_type="chat.completion.chunk",
        created=1,
        model=model,
        include_usage=include_usage,
    )
    frame = encoder.choices([{"index": 0, "delta": {"content": text}}])
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    payload = json.loads(frame[6:])
    assert payload["model"] == model
    assert payload["choices"][0]["delta"]["content"] == text
    assert ("usage" in payload) is include_usage
    usage = json.loads(encoder.usage({"total_tokens": 3})[6:])
    assert (usage["choices"], usage["usage"]) == ([], {"total_tokens": 3})
