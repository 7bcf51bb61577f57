"""The prompt and output token estimates: the documented rule, case by case."""

from __future__ import annotations

import json

import pytest

from sluicegate.filters.estimate import (
    estimate_output_tokens,
    estimate_span_tokens,
    estimate_text_tokens,
)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("a", 1),  # ceil(1 / 4)
        ("abcd", 1),
        ("abcde", 2),
        ("hello world!", 3),
        ("中文", 2),  # one per non-ASCII character
        ("ab中", 2),  # ceil(2 / 4) + 1
        ("привет", 6),
        ("😀", 1),  # one code point
        ('"\\u4e2d"', 2),  # escaped: 8 ASCII characters
        ("\\u4e2d\\u6587", 3),  # 12 ASCII characters: 1.5 tokens a character, rounded up
        ("line\\nbreak", 3),  # the escape counts as its two characters
        ("é" * 10 + "x" * 8, 12),
    ],
)
def test_text_rule(text: str, tokens: int):
    assert estimate_text_tokens(text) == tokens


def test_spans_are_rounded_up_once_over_all_of_them():
    text = '{"a":"xy","b":"zw"}'
    spans = [(5, 9), (14, 18)]  # '"xy"' and '"zw"': 8 ASCII characters
    assert estimate_span_tokens(text, spans) == 2
    assert estimate_span_tokens(text, []) == 0


@pytest.mark.parametrize(
    "text",
    ['{"p":"中文 and ascii"}', '{"p":"plain ascii only here"}', '{"p":"ok"}  '],
)
def test_spans_agree_with_the_text_rule(text: str):
    start = text.index(":") + 1
    end = text.rindex("}")
    assert estimate_span_tokens(text, [(start, end)]) == estimate_text_tokens(text[start:end])


def test_a_chat_message_costs_its_framing():
    """No per-message constant: the JSON framing of a message stands in for it."""
    framing = json.dumps({"role": "user", "content": ""}, separators=(",", ":"))
    assert estimate_text_tokens(framing) >= 4  # OpenAI documents about 3 a message


def test_large_inputs_are_handled_whole():
    text = "word " * 200_000 + "字" * 100_000
    assert estimate_text_tokens(text) == 250_000 + 100_000


@pytest.mark.parametrize(
    ("max_tokens", "n", "default", "tokens"),
    [
        (None, 1, 4096, 4096),
        (100, 1, 4096, 100),
        (100, 3, 4096, 300),
        (None, 2, 512, 1024),
        (1, 128, 4096, 128),
    ],
)
def test_output_estimate(max_tokens: int | None, n: int, default: int, tokens: int):
    assert estimate_output_tokens(max_tokens, n, default) == tokens
