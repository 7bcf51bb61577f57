"""Reading real usage from response bodies, streamed (SSE) or not (JSON)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluicegate.filters.usage import (
    JSON_TAIL_BYTES,
    JsonUsageParser,
    NullUsageParser,
    ObservedUsage,
    SseUsageParser,
    UsageParser,
    usage_parser,
)


def data(document: Any) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


def content(text: str) -> bytes:
    return data(
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    )


def usage(prompt: Any, completion: Any) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion}


DONE = b"data: [DONE]\n\n"
ROLE = data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
FINISH = data({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})


def sse(*chunks: bytes, max_json_bytes: int = 1 << 20) -> ObservedUsage:
    parser = SseUsageParser(max_json_bytes)
    for chunk in chunks:
        parser.feed(chunk)
    return parser.finish()


def seen(
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    chunks: int = 0,
    malformed: int = 0,
    done: bool = True,
) -> ObservedUsage:
    return ObservedUsage(input_tokens, output_tokens, chunks, malformed, done)


# ----- SSE -----------------------------------------------------------------------------------

OPENAI_WITH_USAGE = [
    ROLE,
    content("Hel"),
    content("lo"),
    FINISH,
    data({"choices": [], "usage": usage(9, 2)}),
    DONE,
]


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (OPENAI_WITH_USAGE, seen(9, 2, chunks=2)),
        ([ROLE, content("a"), content("b"), content("c"), FINISH, DONE], seen(chunks=3)),
        ([content("a")], seen(chunks=1, done=False)),  # cut before [DONE]
        ([], seen(done=False)),
        # usage on every chunk: the last wins
        (
            [
                data({"choices": [{"delta": {"content": "a"}}], "usage": usage(5, 1)}),
                data({"choices": [{"delta": {"content": "b"}}], "usage": usage(5, 2)}),
                DONE,
            ],
            seen(5, 2, chunks=2),
        ),
        # OpenAI's include_usage sends "usage": null on the content chunks
        (
            [data({"choices": [{"delta": {"content": "a"}}], "usage": None}), DONE],
            seen(chunks=1),
        ),
        # usage split across events (input first, output last): each field keeps its last value
        (
            [
                data({"type": "message_start", "usage": {"input_tokens": 12, "output_tokens": 1}}),
                data({"type": "message_delta", "usage": {"output_tokens": 30}}),
            ],
            seen(12, 30, done=False),
        ),
        # legacy completions stream text
        (
            [data({"choices": [{"text": "once"}]}), data({"choices": [{"text": ""}]}), DONE],
            seen(chunks=1),
        ),
        # tool calls, reasoning and refusals are generated tokens too
        (
            [
                data(
                    {
                        "choices": [
                            {"delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}}
                        ]
                    }
                ),
                data(
                    {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": '{"a'}}]}}]}
                ),
                data({"choices": [{"delta": {"function_call": {"arguments": "1"}}}]}),
                data({"choices": [{"delta": {"reasoning_content": "hmm"}}]}),
                data({"choices": [{"delta": {"reasoning": "so"}}]}),
                data({"choices": [{"delta": {"refusal": "no"}}]}),
                DONE,
            ],
            seen(chunks=5),
        ),
        # one event with several choices counts once
        (
            [data({"choices": [{"delta": {"content": "a"}}, {"delta": {"content": "b"}}]}), DONE],
            seen(chunks=1),
        ),
    ],
)
def test_sse_streams(stream: list[bytes], expected: ObservedUsage):
    assert sse(*stream) == expected
    assert sse(b"".join(stream)) == expected


def test_responses_api_stream():
    stream = [
        b"event: response.created\n" + data({"type": "response.created", "response": {}}),
        b"event: response.output_text.delta\n"
        + data({"type": "response.output_text.delta", "delta": "Hi"}),
        data({"type": "response.output_text.delta", "delta": ""}),
        data({"type": "response.function_call_arguments.delta", "delta": "{}"}),
        b"event: response.completed\n"
        + data(
            {
                "type": "response.completed",
                "response": {"usage": {"input_tokens": 7, "output_tokens": 3}},
            }
        ),
    ]
    assert sse(*stream) == seen(7, 3, chunks=2, done=True)


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        # no space after the colon, comments, other fields
        (
            b': keep-alive\n\nid: 1\nevent: message\nretry: 100\ndata:{"choices":[],"usage":'
            b'{"prompt_tokens":1,"completion_tokens":2}}\n\ndata:[DONE]\n\n',
            seen(1, 2),
        ),
        # CRLF and lone CR line ends
        (content("a").replace(b"\n", b"\r\n") + b"data: [DONE]\r\r", seen(chunks=1)),
        # an event's data lines are joined with LF
        (b'data: {"choices":\ndata: [{"delta": {"content": "x"}}]}\n\n' + DONE, seen(chunks=1)),
        # a field whose name only starts with "data" is not data
        (b'database: {"usage": {"prompt_tokens": 1}}\n\n' + DONE, seen()),
        # "data" without a colon is an empty data line: nothing to read
        (b"data\n\n" + DONE, seen()),
        # events not separated by a blank line are one event (and do not parse)
        (b'data: {"usage": {"prompt_tokens": 1}}\ndata: [DONE]\n\n', seen(malformed=1, done=False)),
        # [DONE] tolerates surrounding whitespace
        (b"data:  [DONE] \n\n", seen()),
        # valid JSON that is not an event object is ignored
        (b"data: 42\n\ndata: []\n\n" + DONE, seen()),
        # an unterminated last event is still read at finish
        (
            b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}',
            seen(3, 4, done=False),
        ),
        (b"data: [DONE]", seen()),
    ],
)
def test_sse_framing(stream: bytes, expected: ObservedUsage):
    assert sse(stream) == expected
    assert sse(*(stream[i : i + 1] for i in range(len(stream)))) == expected


@pytest.mark.parametrize(
    "line",
    [
        b"data: {not json}\n\n",
        b'data: {"choices": [\n\n',
        b'data: {"a": "\xff"}\n\n',  # not UTF-8
        b"data: " + b"[" * 100_000 + b"\n\n",  # too deep
        b"data: " + b"9" * 5000 + b"\n\n",  # an integer past Python's digit limit
        b"data: DONE\n\n",
    ],
)
def test_sse_malformed_events_are_counted_and_skipped(line: bytes):
    assert sse(content("a"), line, content("b"), DONE) == seen(chunks=2, malformed=1)


@pytest.mark.parametrize(
    "bad",
    [-1, 1.5, 3.0, True, "12", None, 10**9 + 1, 10**12, [1], {"n": 1}],
)
def test_invalid_usage_numbers_are_ignored(bad: Any):
    assert sse(data({"choices": [], "usage": usage(bad, 4)}), DONE) == seen(None, 4)
    assert sse(data({"choices": [], "usage": usage(3, bad)}), DONE) == seen(3, None)
    # and do not replace an earlier valid value
    first = data({"choices": [], "usage": usage(3, 4)})
    assert sse(first, data({"choices": [], "usage": usage(bad, bad)}), DONE) == seen(3, 4)


@pytest.mark.parametrize("value", [0, 10**9])
def test_usage_bounds_are_inclusive(value: int):
    assert sse(data({"usage": usage(value, value)})) == seen(value, value, done=False)


def test_usage_object_of_the_wrong_type_is_ignored():
    assert sse(data({"usage": [1, 2]}), data({"usage": "x"}), DONE) == seen()


def test_multibyte_characters_split_across_chunks():
    text = "日本語 😀"
    event = {"choices": [{"delta": {"content": text}}], "usage": usage(1, 2)}
    stream = b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n" + DONE
    start = stream.index(text.encode())
    for cut in range(start, start + len(text.encode()) + 1):  # inside each character too
        assert sse(stream[:cut], stream[cut:]) == seen(1, 2, chunks=1), cut


def test_crlf_split_across_chunks_is_one_line_end():
    stream = b'data: {"choices":[{"delta":{"content":"x"}}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    for cut in range(len(stream) + 1):
        assert sse(stream[:cut], stream[cut:]) == seen(chunks=1), cut


def test_an_overlong_line_is_dropped_and_counted_once():
    big = content("x" * 500)
    small = data({"choices": [], "usage": usage(1, 2)})
    expected = seen(1, 2, malformed=1)
    assert sse(big, small, DONE, max_json_bytes=200) == expected
    # the same, fed in pieces smaller than the limit and across the line's end
    stream = big + small + DONE
    assert (
        sse(*(stream[i : i + 37] for i in range(0, len(stream), 37)), max_json_bytes=200)
        == expected
    )
    assert sse(*(stream[i : i + 1] for i in range(len(stream))), max_json_bytes=200) == expected


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_a_line_of_exactly_the_limit_is_kept(step: int):
    line = b'data: {"usage": {"prompt_tokens": 1}}'
    stream = line + b"\n\n" + line.replace(b"1}", b"22}") + b"\n\n"
    chunks = [stream[i : i + step] for i in range(0, len(stream), step)]
    assert sse(*chunks, max_json_bytes=len(line)) == seen(1, malformed=1, done=False)


@pytest.mark.parametrize(("extra", "expected"), [(0, seen(chunks=1)), (-1, seen(malformed=1))])
def test_the_event_limit_counts_the_data_joined_with_lf(extra: int, expected: ObservedUsage):
    lines = [b"{", b'"choices"', b":", b'[{"text":"x"}]', b"}"]
    event = b"".join(b"data:" + line + b"\n" for line in lines) + b"\n"
    joined = len(b"\n".join(lines))  # 30; the longest line is 19 bytes
    assert sse(event + DONE, max_json_bytes=joined + extra) == expected


def test_an_overlong_event_made_of_short_lines_is_dropped():
    lines = b"".join(b"data: " + b"1" * 50 + b"\n" for _ in range(10))
    assert sse(lines + b"\n" + content("a") + DONE, max_json_bytes=200) == seen(
        chunks=1, malformed=1
    )


def test_memory_stays_bounded_by_the_limit():
    parser = SseUsageParser(1000)
    for _ in range(1000):
        parser.feed(b"x" * 999)  # one endless line
    assert sum(len(piece) for piece in parser._partial) <= 1000
    parser.feed(b"\n" + DONE)
    assert parser.finish() == seen(malformed=1)


def test_finish_is_idempotent_and_later_chunks_are_ignored():
    parser = SseUsageParser()
    parser.feed(content("a"))
    first = parser.finish()
    parser.feed(content("b") + DONE)
    assert parser.finish() == first == seen(chunks=1, done=False)


def test_empty_chunks_change_nothing():
    assert sse(b"", content("a")[:5], b"", content("a")[5:], b"", DONE) == seen(chunks=1)


# ----- JSON ----------------------------------------------------------------------------------

CHAT_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
}


def json_body(body: bytes, *, chunk: int = 0, max_json_bytes: int = 1 << 20) -> ObservedUsage:
    parser = JsonUsageParser(max_json_bytes)
    step = chunk or max(len(body), 1)
    for start in range(0, len(body), step):
        parser.feed(body[start : start + step])
    return parser.finish()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (json.dumps(CHAT_COMPLETION).encode(), seen(11, 5, done=True)),
        (b'{"object": "response", "usage": {"input_tokens": 4, "output_tokens": 6}}', seen(4, 6)),
        (
            b'{"object": "list", "data": [], "usage": {"prompt_tokens": 8, "total_tokens": 8}}',
            seen(8),
        ),
        (b'{"error": {"message": "nope"}}', seen()),
        (b'{"usage": {"prompt_tokens": -1, "completion_tokens": true}}', seen()),
        (b"[1, 2]", seen()),
        (b'{"usage": {"prompt_tokens": 1}', seen(malformed=1, done=False)),
        (b'{"a": "\xff"}', seen(malformed=1, done=False)),
        (b"", seen(done=False)),
    ],
)
def test_json_documents(body: bytes, expected: ObservedUsage):
    assert json_body(body) == expected
    assert json_body(body, chunk=3) == expected


def test_an_overlong_document_still_gives_the_usage_at_its_end():
    document = {"object": "list", "data": [{"embedding": [0.125] * 50_000}], **CHAT_COMPLETION}
    body = json.dumps(document).encode()
    assert len(body) > 200_000
    expected = seen(11, 5, malformed=1, done=False)
    assert json_body(body, max_json_bytes=100_000) == expected
    assert json_body(body, chunk=4096, max_json_bytes=100_000) == expected
    assert json_body(body, chunk=100_001, max_json_bytes=100_000) == expected


def test_an_overlong_document_keeps_only_its_tail():
    parser = JsonUsageParser(10_000)
    for _ in range(1000):
        parser.feed(b" " * 1000)
    assert sum(len(part) for part in parser._parts) < JSON_TAIL_BYTES + 1000


@pytest.mark.parametrize(
    "tail",
    [
        b'"content": "the \\"usage\\": {\\"prompt_tokens\\": 5}"}',  # only inside a string
        b'"usage": {"prompt_tokens": 5',  # cut
        b'"usage" 5',
        b"no usage at all",
    ],
)
def test_an_overlong_document_without_readable_usage(tail: bytes):
    assert json_body(b" " * 2000 + tail, max_json_bytes=1000) == seen(malformed=1, done=False)


def test_json_finish_is_idempotent():
    parser = JsonUsageParser()
    parser.feed(json.dumps(CHAT_COMPLETION).encode())
    first = parser.finish()
    parser.feed(b"garbage")
    assert parser.finish() == first


# ----- choosing a parser ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        ("text/event-stream", SseUsageParser),
        ("text/event-stream; charset=utf-8", SseUsageParser),
        ("Text/Event-Stream", SseUsageParser),
        ("application/json", JsonUsageParser),
        ("application/json; charset=utf-8", JsonUsageParser),
        ("application/problem+json", JsonUsageParser),
        (None, JsonUsageParser),
        ("", JsonUsageParser),
        ("audio/mpeg", NullUsageParser),
        ("text/plain", NullUsageParser),
    ],
)
def test_usage_parser_by_content_type(content_type: str | None, kind: type):
    parser: UsageParser = usage_parser(content_type)
    assert isinstance(parser, kind)


def test_usage_parser_passes_the_limit():
    parser = usage_parser("text/event-stream", max_json_bytes=100)
    parser.feed(content("x" * 200) + DONE)
    assert parser.finish() == seen(malformed=1)


def test_null_parser_sees_nothing():
    parser = usage_parser("audio/mpeg")
    parser.feed(b"ID3\x00" * 100)
    assert parser.finish() == seen(done=False)
