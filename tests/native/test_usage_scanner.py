"""The native usage reader's scanning (sluicegate/native/c/usage_scanner.c), through
ctypes: built alone with gcc, driven chunk by chunk as the Envoy glue drives it.

The stream usage Lua filter's rules (xds/translate/stream_usage.py) are ported below
(`lua_text_events`, `lua_without_usage_event`) and the scanner compared with them on
examples; a fuzz test feeds random bytes in random chunks.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate import wire
from sluicegate.native import SCANNER, NativeBuildError, build

JSON, SSE = 0, 1
COUNT, CUT = 1, 2
MEMBERS: Final = ",".join(wire.USAGE_MEMBERS).encode()


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    try:
        path = build(SCANNER, into=tmp_path_factory.mktemp("scanner"))
    except NativeBuildError as error:
        pytest.skip(str(error))
    library = ctypes.CDLL(str(path))
    p, size, char_p = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "sg_names_new": (p, [char_p, size]),
        "sg_names_free": (None, [p]),
        "sg_names_slots": (size, [p]),
        "sg_names_key": (char_p, [p, size]),
        "sg_scanner_new": (p, [p, ctypes.c_int, ctypes.c_int]),
        "sg_scanner_free": (None, [p]),
        "sg_scanner_push": (ctypes.c_int, [p, char_p, size]),
        "sg_scanner_finish": (None, [p]),
        "sg_scanner_take": (ctypes.c_int, [p, ctypes.POINTER(p), ctypes.POINTER(size)]),
        "sg_scanner_cut_done": (ctypes.c_bool, [p]),
        "sg_scanner_changed": (ctypes.c_uint, [p]),
        "sg_scanner_value": (ctypes.c_bool, [p, size, ctypes.POINTER(ctypes.c_double)]),
        "sg_scanner_count": (size, [p]),
    }
    for name, (result, arguments) in signatures.items():
        function = getattr(library, name)
        function.restype, function.argtypes = result, arguments
    return library


@dataclass(frozen=True)
class Read:
    """What a scanner made of an answer: values written, count, bytes passed on."""

    usage: dict[str, float]
    count: int
    passed: bytes
    cut: bool


def scan(lib: ctypes.CDLL, chunks: Sequence[bytes], kind: int = SSE, flags: int = 0,
         members: bytes = MEMBERS, ending: str = "empty") -> Read:  # fmt: skip
    """The chunks through one scanner as usage_filter.c drives it: a hook's bytes pushed
    (none for an empty chunk: read_chunk pushes nothing when Envoy gives no slices), then
    take (the chunk passes or is replaced). The end of stream: `empty`, an empty last data
    frame or trailers (finish and take with no push, as Envoy's HTTP/1 codec ends every
    chunked body); `last`, with the last chunk (finish after its push, before its take)."""
    names = lib.sg_names_new(members, len(members))
    assert names
    scanner = lib.sg_scanner_new(names, kind, flags)
    assert scanner
    passed = bytearray()
    usage: dict[str, float] = {}
    frames = [*chunks, b""] if ending == "empty" or not chunks else list(chunks)
    try:
        for index, chunk in enumerate(frames):
            if chunk:
                assert lib.sg_scanner_push(scanner, chunk, len(chunk)) == 0
            if index == len(frames) - 1:
                lib.sg_scanner_finish(scanner)
            out, length = ctypes.c_void_p(), ctypes.c_size_t()
            if lib.sg_scanner_take(scanner, ctypes.byref(out), ctypes.byref(length)):
                passed += ctypes.string_at(out, length.value) if length.value else b""
            else:
                passed += chunk
            changed = lib.sg_scanner_changed(scanner)
            for slot in range(lib.sg_names_slots(names)):
                value = ctypes.c_double()
                if changed & (1 << slot):
                    assert lib.sg_scanner_value(scanner, slot, ctypes.byref(value))
                    usage[lib.sg_names_key(names, slot).decode()] = value.value
        return Read(usage, lib.sg_scanner_count(scanner), bytes(passed),
                    lib.sg_scanner_cut_done(scanner))  # fmt: skip
    finally:
        lib.sg_scanner_free(scanner)
        lib.sg_names_free(names)


def splits(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def every_split(data: bytes) -> Iterator[list[bytes]]:
    """The whole, then every two-piece split, then byte by byte."""
    yield [data]
    for at in range(1, len(data)):
        yield [data[:at], data[at:]]
    yield splits(data, 1)


# ---- the Lua filter's rules, ported -----------------------------------------------

LUA_SPACE: Final = "[ \t\n\r\x0b\x0c]"
TEXT_KEYS: Final = ('"content":', '"reasoning_content":', '"reasoning":', '"refusal":',
                    '"arguments":', '"text":', '"delta":')  # fmt: skip


def lua_has_string(line: str, key: str) -> bool:
    start = 0
    while (at := line.find(key, start)) >= 0:
        stop = at + len(key)
        first = re.match(LUA_SPACE + '*"(.)', line[stop:], re.DOTALL)
        if first is not None and first.group(1) != '"':
            return True
        start = stop
    return False


def lua_has_text(line: str) -> bool:
    if '"response.' in line:
        kind = re.search('"type":' + LUA_SPACE + r'*"response\.', line)
        if kind is not None:
            close = line.find('"', kind.end())
            if close < 0 or line[close - 6 : close] != ".delta":
                return False
            return lua_has_string(line, '"delta":')
    return any(lua_has_string(line, key) for key in TEXT_KEYS)


def lua_text_events(text: str) -> int:
    return sum(lua_has_text(line) for line in re.findall("data:[^\n]*", text))


def lua_without_usage_event(events: str) -> tuple[str, bool]:
    pieces, cut, start = [], False, 0
    while start < len(events):
        boundary = re.compile("\n\r?\n").search(events, start)
        stop = boundary.end() if boundary else len(events)
        event = events[start:stop]
        usage = re.search('"usage":' + LUA_SPACE + "*{", event)
        choices = re.search('"choices":' + LUA_SPACE + r"*\[" + LUA_SPACE + r"*\]", event)
        if not cut and usage and choices:
            cut = True
        else:
            pieces.append(event)
        start = stop
    return "".join(pieces), cut


# ---- examples ----------------------------------------------------------------------


def chat_event(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [choice]})


USAGE_EVENT: Final = "data: " + json.dumps({
    "object": "chat.completion.chunk", "choices": [],
    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
})  # fmt: skip
CHAT: Final = (
    chat_event({"role": "assistant", "content": ""}),
    chat_event({"content": "Hel"}),
    chat_event({"content": 'lo "usage": {"prompt_tokens": 99}'}),
    chat_event({"reasoning_content": "hmm"}),
    chat_event({"tool_calls": [{"function": {"arguments": "{}"}}]}),
    chat_event({}, "stop"),
)


def stream(events: Sequence[str], end: str = "\n") -> bytes:
    return "".join(event.replace("\n", end) + end * 2 for event in events).encode()


CHAT_STREAM: Final = stream([*CHAT, USAGE_EVENT, "data: [DONE]"])
USAGE_11_3: Final = {"prompt_tokens": 11.0, "completion_tokens": 3.0}
JSON_ANSWER: Final = json.dumps({
    "object": "chat.completion",
    "choices": [{"message": {"content": '"usage": {"prompt_tokens": 1}'}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
}).encode()  # fmt: skip


# ---- JSON answers ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "usage"),
    [
        (JSON_ANSWER, {"prompt_tokens": 7.0, "completion_tokens": 5.0}),
        (b'{"usage":{"prompt_tokens":1,"completion_tokens":2},"choices":[]}',
         {"prompt_tokens": 1.0, "completion_tokens": 2.0}),
        (b' \n{ "usage" : { "input_tokens" : 5 , "output_tokens" : 6e0 } } \r\n',
         {"input_tokens": 5.0, "output_tokens": 6.0}),
        (b'{"a":{"usage":{"prompt_tokens":1}},"b":[{"usage":{"prompt_tokens":2}}]}', {}),
        (b'{"x":"\\"usage\\":{\\"prompt_tokens\\":3}","y":"\\\\"}', {}),
        (b'{"s":"a\\\\","usage":{"prompt_tokens":4}}', {"prompt_tokens": 4.0}),
        (b'{"us\\u0061ge":{"prompt_tokens":4}}', {}),  # an escaped key is not recognised
        (b'{"usage":{"prompt_tokens":"4","completion_tokens":null,"input_tokens":{}}}', {}),
        (b'{"usage":null}', {}),
        (b'{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2}}',
         {"completion_tokens": 2.0}),
        (b'{"usage":{"prompt_tokens":1},"usage":null}', {}),
        (b'{"usage":{"prompt_tokens":1,"prompt_tokens":"x"}}', {}),
        (b'{"usage":{"prompt_tokens":' + b"1" * 70 + b"}}", {}),  # too long to be a count
        (b'{"usage":{"prompt_tokens":-0.5e1}}', {"prompt_tokens": -5.0}),
        (b'{"response":{"usage":{"input_tokens":1}}}', {}),  # a stream's path only
    ],
)  # fmt: skip
def test_json_usage_whatever_the_chunking(lib: ctypes.CDLL, body: bytes,
                                          usage: dict[str, float]) -> None:  # fmt: skip
    for chunks in every_split(body):
        assert scan(lib, chunks, JSON).usage == usage, chunks


@pytest.mark.parametrize(
    "body",
    [
        b'{"usage":{"prompt_tokens":1}',  # truncated
        b'{"usage":{"prompt_tokens":1}}}',
        b'{"usage":{"prompt_tokens":1}} x',
        b'{"usage":{"prompt_tokens":1}}{}',
        b'{"usage":{"prompt_tokens":1]}',
        b'{"usage":{"prompt_tokens":01}}',
        b'{"usage":{"prompt_tokens":1.}}',
        b'{"usage":{"prompt_tokens":1},}',
        b'{"usage" {"prompt_tokens":1}}',
        b'{"usage":{"prompt_tokens":1}, "x": tru}',
        b'[{"usage":{"prompt_tokens":1}}]',
        b'{"usage":{"prompt_tokens":1}, "x": "unterminated}',
        b"",
    ],
)
def test_json_not_whole_writes_nothing(lib: ctypes.CDLL, body: bytes) -> None:
    for chunks in every_split(body):
        assert scan(lib, chunks, JSON).usage == {}, chunks


def test_json_passes_bytes_untouched(lib: ctypes.CDLL) -> None:
    read = scan(lib, splits(JSON_ANSWER, 7), JSON, COUNT | CUT)
    assert read.passed == JSON_ANSWER and read.count == 0


def test_json_nesting_deeper_than_the_limit_is_refused(lib: ctypes.CDLL) -> None:
    deep = b'{"usage":{"prompt_tokens":1},"x":' + b"[" * 600 + b"]" * 600 + b"}"
    assert scan(lib, [deep], JSON).usage == {}
    fine = b'{"usage":{"prompt_tokens":1},"x":' + b"[" * 400 + b"]" * 400 + b"}"
    assert scan(lib, [fine], JSON).usage == {"prompt_tokens": 1.0}


@pytest.mark.parametrize(
    ("number", "value"),
    [(b"0e99999", 0.0), (b"-0E+99999", 0.0), (b"1e-400", 0.0), (b"15e-1", 1.5),
     (b"1.5e3", 1500.0), (b"9007199254740993e0", 9007199254740992.0), (b"1e308", 1e308),
     (b"12.5E-1", 1.25), (b"1e400", None), (b"9e400", None), (b"-9e400", None),
     (b"0.0000000001e99999", None)],
)  # fmt: skip
def test_a_member_number_is_finite_or_not_taken(lib: ctypes.CDLL, number: bytes,
                                                value: float | None) -> None:  # fmt: skip
    """A number beyond a double's range is not a count: not taken (as one too long to
    read), never written as infinity."""
    body = b'{"usage":{"prompt_tokens":' + number + b',"completion_tokens":2}}'
    expected = {"completion_tokens": 2.0} | ({} if value is None else {"prompt_tokens": value})
    for kind, answer in ((JSON, body), (SSE, b"data: " + body + b"\n\n")):
        assert scan(lib, [answer], kind).usage == pytest.approx(expected, rel=1e-12)


def test_numbers_scan_in_bounded_time(lib: ctypes.CDLL) -> None:
    """A number's value is worked out only where it is a usage member, its exponent
    clamped: 1 MB of `0e99999` (each once 99,999 steps: 11 s) scans at once."""
    numbers = b"[" + b"0e99999," * 131_072 + b"0]"
    members = b'{"usage":{' + b'"prompt_tokens":1e-99999,' * 43_000 + b'"prompt_tokens":3}}'
    started = time.monotonic()
    assert scan(lib, [numbers], JSON).usage == {}
    assert scan(lib, [b'{"x":' + numbers + b"}"], JSON).usage == {}
    assert scan(lib, [members], JSON).usage == {"prompt_tokens": 3.0}
    assert time.monotonic() - started < 5.0  # generous: milliseconds on any machine


# ---- event streams: usage ----------------------------------------------------------


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_stream_usage_at_every_split(lib: ctypes.CDLL, end: str) -> None:
    body = stream([*CHAT, USAGE_EVENT, "data: [DONE]"], end)
    for chunks in every_split(body):
        assert scan(lib, chunks).usage == USAGE_11_3, chunks


@pytest.mark.parametrize(
    ("events", "usage"),
    [
        (['data: {"usage": null, "choices": []}'], {}),
        (["data: [DONE]"], {}),
        (['data: {"usage": {"prompt_tokens": 1}}', 'data: {"usage": {"prompt_tokens": 2}}'],
         {"prompt_tokens": 2.0}),
        (['data: {"usage": {"prompt_tokens": 1, "completion_tokens": 5}}',
          'data: {"usage": null}', 'data: {"usage": {"prompt_tokens": 2}}'],
         {"prompt_tokens": 2.0, "completion_tokens": 5.0}),
        (['data: {"usage":\ndata: {"prompt_tokens": 4}}'], {"prompt_tokens": 4.0}),
        (['data:{"usage":{"prompt_tokens":4}}'], {"prompt_tokens": 4.0}),
        (['data\ndata: {"usage":{"prompt_tokens":4}}'], {"prompt_tokens": 4.0}),
        (['event: x\nid: 3\n: comment\ndata: {"usage":{"prompt_tokens":4}}\nretry: 1'],
         {"prompt_tokens": 4.0}),
        (['data: {"usage":{"prompt_tokens":4}', "data: }"], {}),  # two events, neither whole
        (['data: {"usage":{"prompt_tokens":4}} x'], {}),
        (['Data: {"usage":{"prompt_tokens":4}}'], {}),
        (['data: {"type":"response.completed","response":{"usage":'
          '{"input_tokens":5,"output_tokens":2,"total_tokens":7}}}'],
         {"input_tokens": 5.0, "output_tokens": 2.0}),
        (['data: {"usage":{"input_tokens":1},"response":{"usage":{"input_tokens":9}}}'],
         {"input_tokens": 9.0}),
        (['data: {"response":{"usage":{"input_tokens":9}},"usage":{"input_tokens":1}}'],
         {"input_tokens": 9.0}),  # sse_to_metadata's rule order: response.usage last
    ],
)  # fmt: skip
def test_stream_usage_rules(lib: ctypes.CDLL, events: list[str],
                            usage: dict[str, float]) -> None:  # fmt: skip
    body = stream(events)
    for chunks in every_split(body):
        assert scan(lib, chunks).usage == usage, chunks


def test_an_event_without_its_blank_line_is_not_read(lib: ctypes.CDLL) -> None:
    assert scan(lib, [b'data: {"usage":{"prompt_tokens":4}}\n']).usage == {}


def test_an_event_larger_than_8_kb_is_read(lib: ctypes.CDLL) -> None:
    completed = {"type": "response.completed", "response": {
        "output": [{"content": [{"text": "x" * 200_000}]}],
        "usage": {"input_tokens": 5, "output_tokens": 2}}}  # fmt: skip
    body = stream(["data: " + json.dumps(completed)])
    for size in (1, 512, 8192, len(body)):
        body_chunks = [*splits(body[:300], 1), body[300:]] if size == 1 else splits(body, size)
        assert scan(lib, body_chunks).usage == {"input_tokens": 5.0, "output_tokens": 2.0}


# ---- event streams: the count ------------------------------------------------------

COUNT_LINES: Final = [
    *CHAT,
    USAGE_EVENT,
    'data: {"choices":[{"text":"legacy"}]}',
    'data: {"choices":[{"text":""}]}',
    'data: {"choices":[{"delta":{"refusal":"no"}}]}',
    'data: {"choices":[{"delta":{"reasoning":  "x"}}]}',
    'data: {"choices":[{"delta":{"content": null}}]}',
    'data: {"x":"\\"content\\":\\"escaped\\""}',
    'data: {"type":"response.output_text.delta","delta":"Hi"}',
    'data: {"type":"response.output_text.delta","delta":""}',
    'data: {"type":"response.output_text.done","text":"Hi"}',
    'data: {"type":"response.completed","response":{"output":[{"text":"Hi"}]}}',
    'data: {"type": "response.reasoning.delta", "delta": "r"}',
    'data: {"delta":"d","type":"response.x.delta"}',
    'data: {"type":"other","content":"c","response.x":1}',
    'data: {"type":"response.x.delta","content":"c"}',
    'data: {"type":"response.unterminated',
    'data: {"content":"',
    'data: {"content":""}',
    "data: [DONE]",
]


@pytest.mark.parametrize("line", COUNT_LINES)
def test_count_of_one_line_as_the_lua(lib: ctypes.CDLL, line: str) -> None:
    body = stream([line])
    expected = lua_text_events(body.decode())
    for chunks in every_split(body):
        assert scan(lib, chunks, SSE, COUNT).count == expected, chunks


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_count_of_a_stream_each_line_once(lib: ctypes.CDLL, end: str) -> None:
    events = [*COUNT_LINES, 'event: message\ndata: {"content":"a"}\ndata: {"text":"b"}']
    expected = lua_text_events(stream(events).decode())  # the Lua, given the whole body
    assert expected == 13
    body = stream(events, end)
    for size in (1, 2, 3, 7, 64, len(body)):
        assert scan(lib, splits(body, size), SSE, COUNT).count == expected


def test_count_only_when_asked(lib: ctypes.CDLL) -> None:
    assert scan(lib, [CHAT_STREAM], SSE).count == 0


def test_a_last_line_without_its_end_is_counted(lib: ctypes.CDLL) -> None:
    assert scan(lib, [b'data: {"content":"x"}'], SSE, COUNT).count == 1


# ---- event streams: the cut --------------------------------------------------------


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_the_usage_event_is_cut_once_at_every_split(lib: ctypes.CDLL, end: str) -> None:
    body = stream([*CHAT, USAGE_EVENT, USAGE_EVENT, "data: [DONE]"], end)
    kept = stream([*CHAT, USAGE_EVENT, "data: [DONE]"], end)
    if end == "\n":
        assert lua_without_usage_event(body.decode()) == (kept.decode(), True)
    for chunks in every_split(body):
        read = scan(lib, chunks, SSE, CUT | COUNT)
        assert read.passed == kept, chunks
        assert read.cut and read.usage == USAGE_11_3 and read.count == 4


def test_the_cut_holds_a_partial_event_and_releases_it_whole(lib: ctypes.CDLL) -> None:
    names = lib.sg_names_new(MEMBERS, len(MEMBERS))
    scanner = lib.sg_scanner_new(names, SSE, CUT)
    out, length = ctypes.c_void_p(), ctypes.c_size_t()

    def push(data: bytes) -> bytes | None:
        lib.sg_scanner_push(scanner, data, len(data))
        if not lib.sg_scanner_take(scanner, ctypes.byref(out), ctypes.byref(length)):
            return None  # passes as it came
        return ctypes.string_at(out, length.value) if length.value else b""

    try:
        assert push(b"data: 1\n\n") is None
        assert push(b"data: 2\n\ndata: 3") == b"data: 2\n\n"
        assert push(b"more\n") == b""
        assert push(b"\ndata: 4") == b"data: 3more\n\n"
        assert push(b"\n\n") == b"data: 4\n\n"
        assert push(USAGE_EVENT.encode()[:20]) == b""
        assert push(USAGE_EVENT.encode()[20:] + b"\n\ndata: [DONE]") == b"data: [DONE]"
        assert lib.sg_scanner_cut_done(scanner)
        assert push(b"\n\n") is None  # the cut made, all passes
    finally:
        lib.sg_scanner_free(scanner)
        lib.sg_names_free(names)


def test_done_without_its_blank_line_passes(lib: ctypes.CDLL) -> None:
    body = stream(CHAT[:2]) + b"data: [DONE]"
    for chunks in every_split(body):
        read = scan(lib, chunks, SSE, CUT)
        assert read.passed == body and not read.cut


@pytest.mark.parametrize(
    ("event", "cut"),
    [
        (USAGE_EVENT, True),
        ('data: {"usage" : {"x":1}, "choices":[]}', False),  # no `"usage":` as written
        ('data: {"usage":\t{"x":1}, "choices": [ ]}', True),
        ('data: {"usage":{"x":1}, "choices":[{"delta":{}}]}', False),  # a content event's
        ('data: {"usage":null, "choices":[]}', False),
        ('data: {"choices":[],\ndata: "usage":{}}', True),  # any line of the event
    ],
)  # fmt: skip
def test_which_event_is_cut_as_the_lua(lib: ctypes.CDLL, event: str, cut: bool) -> None:
    body = stream([CHAT[1], event, "data: [DONE]"])
    kept, lua_cut = lua_without_usage_event(body.decode())
    assert lua_cut == cut
    for chunks in every_split(body):
        read = scan(lib, chunks, SSE, CUT)
        assert (read.passed.decode(), read.cut) == (kept, cut), chunks


def test_held_bytes_pass_at_the_end(lib: ctypes.CDLL) -> None:
    body = stream(CHAT[:2]) + b'data: {"content":"no blank line"}\n'
    for chunks in every_split(body):
        assert scan(lib, chunks, SSE, CUT).passed == body


def test_without_the_cut_bytes_pass_untouched(lib: ctypes.CDLL) -> None:
    read = scan(lib, splits(CHAT_STREAM, 5), SSE, COUNT)
    assert read.passed == CHAT_STREAM and not read.cut


@pytest.mark.parametrize("ending", ["empty", "last"])
def test_a_hook_without_bytes_passes_nothing_twice(lib: ctypes.CDLL, ending: str) -> None:
    """A take with no push before it (an empty data frame: the end of every chunked HTTP/1
    body, or one mid-stream; trailers) passes only what the last take held back."""
    body = b"data: a\n\ndata: b"
    assert scan(lib, [body], SSE, CUT).passed == body  # the end an empty frame
    assert scan(lib, [body, b"", b"", b"\n\ndata: c"], SSE, CUT, ending=ending).passed == (
        body + b"\n\ndata: c"
    )
    cut = stream([CHAT[1], USAGE_EVENT]) + b"data: b"
    for chunks in ([cut], [cut, b""], [b"", *splits(cut, 9), b""]):
        read = scan(lib, chunks, SSE, CUT | COUNT, ending=ending)
        assert read.passed == stream([CHAT[1]]) + b"data: b" and read.cut, chunks


def test_trailers_release_what_is_held_once(lib: ctypes.CDLL) -> None:
    """The trailers hook: finish and take, no push (usage_filter.c)."""
    names = lib.sg_names_new(MEMBERS, len(MEMBERS))
    scanner = lib.sg_scanner_new(names, SSE, CUT)
    out, length = ctypes.c_void_p(), ctypes.c_size_t()

    def take() -> bytes | None:
        if not lib.sg_scanner_take(scanner, ctypes.byref(out), ctypes.byref(length)):
            return None
        return ctypes.string_at(out, length.value) if length.value else b""

    try:
        lib.sg_scanner_push(scanner, b"data: a\n\ndata: b", 16)
        assert take() == b"data: a\n\n"
        assert take() == b""  # an empty frame mid-stream: nothing yet
        lib.sg_scanner_finish(scanner)
        assert take() == b"data: b"
        assert take() is None
    finally:
        lib.sg_scanner_free(scanner)
        lib.sg_names_free(names)


def test_done_releases_what_is_held_and_starts_afresh(lib: ctypes.CDLL) -> None:
    """A chunk whose held bytes start with `data: [DONE]` passes whole and the event's
    pattern starts again after it, as the Lua's next chunk starts afresh: so which bytes are
    cut after a [DONE] line depends on where the chunks end (the Lua's too)."""
    body = b'data: [DONE]\ndata: {"usage":{"a":1},"choices":[]}\n\n'
    whole = scan(lib, [body], SSE, CUT | COUNT)
    assert lua_without_usage_event(body.decode()) == ("", True)
    assert (whole.passed, whole.cut) == (b"", True)  # one event: all of it cut
    first, second = body[:13], body[13:]
    split = scan(lib, [first, second], SSE, CUT | COUNT)
    rest, cut = lua_without_usage_event(second.decode())  # the Lua, chunk by chunk
    assert (split.passed, split.cut) == (first + rest.encode(), cut) == (first, True)


# ---- fuzz ----------------------------------------------------------------------------

FRAGMENTS: Final = [
    b"data:", b"data: ", b"\n", b"\r", b"\r\n", b"\n\n", b"{", b"}", b"[", b"]", b":", b",",
    b'"', b"\\", b" ", b"1", b"2.5", b"-3e2", b"null", b"true", b'"usage"', b'"usage":',
    b'"choices":', b'"prompt_tokens":', b'"completion_tokens":', b'"response"', b'"type":',
    b'"response.x.delta"', b'"delta":', b'"content":', b'"text":', b'"x"', b"[DONE]",
    b"event: e", b": c", b"\xff", b"\x00",
]  # fmt: skip
bodies = st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(FRAGMENTS), max_size=80).map(b"".join),
    st.lists(
        st.sampled_from([*CHAT, USAGE_EVENT, "data: [DONE]", 'data: {"usage":{"a":1}}']),
        max_size=8,
    ).map(lambda events: stream(events)),
)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def removed_at_most_one_event(data: bytes, passed: bytes) -> bool:
    if passed == data:
        return True
    if len(passed) > len(data):
        return False
    start = next(i for i in range(len(passed) + 1)
                 if i == len(passed) or passed[i] != data[i])  # fmt: skip
    gone = len(data) - len(passed)
    return gone > 0 and data[:start] + data[start + gone :] == passed


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=bodies, cuts=st.lists(st.integers(min_value=0), max_size=12),
       kind=st.sampled_from([JSON, SSE]), ending=st.sampled_from(["empty", "last"]),
       empty=st.lists(st.integers(min_value=0), max_size=3))  # fmt: skip
def test_fuzz_chunking_never_changes_the_result(
    lib: ctypes.CDLL, data: bytes, cuts: list[int], kind: int, ending: str, empty: list[int]
) -> None:
    """Usage and count never depend on the chunking, nor on empty frames between chunks;
    the bytes passed on do not either, but after a `data: [DONE]` line (the Lua's rule,
    test_done_releases_what_is_held_and_starts_afresh): there, only that at most one run of
    bytes is removed."""
    flags = COUNT | CUT
    pieces = split_at(data, cuts)
    for at in empty:  # hooks with no body bytes between the chunks
        pieces.insert(at % (len(pieces) + 1), b"")
    whole = scan(lib, [data], kind, flags)
    chunked = scan(lib, pieces, kind, flags, ending=ending)
    single = scan(lib, splits(data, 1), kind, flags, ending=ending)
    assert chunked.usage == whole.usage == single.usage
    assert chunked.count == whole.count == single.count
    for read in (whole, chunked, single):
        assert removed_at_most_one_event(data, read.passed)
    if kind == JSON:
        assert whole.passed == chunked.passed == single.passed == data
    elif b"data: [DONE]" not in data:
        assert chunked.passed == whole.passed == single.passed
        assert chunked.cut == whole.cut


def test_names_are_checked(lib: ctypes.CDLL) -> None:
    for bad in (b"", b"a,,b", b"a,a", b"x" * 40, b",".join(b"m%d" % i for i in range(9))):
        assert not lib.sg_names_new(bad, len(bad))
    names = lib.sg_names_new(b"prompt_tokens,input_tokens", 26)
    keys = [lib.sg_names_key(names, s) for s in range(lib.sg_names_slots(names))]
    assert keys == [b"prompt_tokens", b"input_tokens", b"output_tokens"]
    lib.sg_names_free(names)


def test_the_scanner_alone_has_no_envoy_symbols(lib: ctypes.CDLL) -> None:
    assert not hasattr(lib, "envoy_dynamic_module_on_program_init")
    assert Path(lib._name).name == f"lib{SCANNER.name}.so"
