"""Property tests for what admission reads: request bodies and response usage.

- inspect_request raises nothing but BodyError, and agrees with an oracle built
  on json.loads for any JSON object.
- The usage parsers never raise, and give the same answer however the body is
  cut into chunks (inside multi-byte characters and CRLF included); on
  generated SSE streams they give the answer the stream was built to give.
- The request record reads the usage members Envoy hands over as the body
  parser reads them in JSON.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import astuple, dataclass, replace
from typing import Any

from google.protobuf import json_format, struct_pb2
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sluicegate import wire
from sluicegate.filters.estimate import estimate_text_tokens
from sluicegate.filters.jsonbody import BodyError
from sluicegate.filters.request_facts import (
    LOGPROBS_MEMBERS,
    MAX_N,
    MAX_TOKENS_MEMBERS,
    PROMPT_MEMBERS,
    READ_MEMBERS,
    RequestFacts,
    inspect_request,
)
from sluicegate.filters.usage import (
    JsonUsageParser,
    ObservedUsage,
    SseUsageParser,
    UsageParser,
)
from sluicegate.records import decode

from ..records.helpers import log_record

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)
# Values chosen to sit on the edges of the checks, mixed with anything at all.
edge_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([MAX_N, MAX_N + 1, 99, 100, 101, 4095, 4096, 4097, 10**20]),
    st.sampled_from([0.0, 1.0, 3.5, 1e400, -1e400, "", "1"]),
    st.dictionaries(
        st.sampled_from(["include_usage", "x"]), st.none() | st.booleans() | st.integers(0, 1)
    ),
    json_values,
)
good_models = st.sampled_from(["gpt-4o", "модель", "m"])


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Valid four times in five, else an edge value (or absent: see `request_objects`)."""
    return st.integers(0, 4).flatmap(lambda pick: edge_values if pick == 0 else valid)


_ABSENT: Any = object()
# Each member the filter reads is absent, valid or an edge value, so every check is reached
# often; other members (and the read names as random keys) ride along.
request_objects = st.tuples(
    st.fixed_dictionaries(
        {
            "model": st.integers(0, 9).flatmap(
                lambda pick: st.just(_ABSENT) if pick == 0 else mostly(good_models)
            )
        },
        optional={
            "stream": mostly(st.booleans()),
            "stream_options": mostly(st.fixed_dictionaries({"include_usage": st.booleans()})),
            "max_tokens": mostly(st.integers(1, 4096)),
            "max_completion_tokens": mostly(st.integers(1, 4096)),
            "max_output_tokens": mostly(st.integers(1, 4096)),
            "n": mostly(st.integers(1, MAX_N)),
            "logprobs": mostly(st.booleans()),
            "top_logprobs": mostly(st.integers(0, 20)),
            **dict.fromkeys(PROMPT_MEMBERS, json_values),
        },
    ),
    st.dictionaries(
        st.sampled_from(sorted(READ_MEMBERS)) | st.text(max_size=5), edge_values, max_size=3
    ),
).map(lambda pair: {k: v for k, v in {**pair[1], **pair[0]}.items() if v is not _ABSENT})
limits = st.sampled_from([1, 100, 4096])


def oracle(document: Any, limit: int, *, ensure_ascii: bool = True) -> RequestFacts | str:
    """What inspect_request must answer, from json.loads' document.

    The prompt estimate is over the members as json.dumps wrote them into the body.
    """
    if not isinstance(document, dict):
        return "object"
    model = document.get("model", "")
    if model == "":
        return "model"
    if not isinstance(model, str):
        return "model_type"
    stream = document.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return "stream"
    options = document.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            return "stream_options"
        include = options.get("include_usage")
        if include is not None and not isinstance(include, bool):
            return "stream_options"
        include_usage = include is True
    max_tokens = None
    for name in MAX_TOKENS_MEMBERS:
        value = document.get(name)
        if value is None:
            continue
        if type(value) is not int or not 1 <= value <= limit:
            return "max_tokens"
        if max_tokens is None:
            max_tokens = value
    n = document.get("n")
    if n is None:
        n = 1
    elif type(n) is not int or not 1 <= n <= MAX_N:
        return "n"
    prompt = "".join(
        json.dumps(document[name], ensure_ascii=ensure_ascii)
        for name in PROMPT_MEMBERS
        if name in document
    )
    logprobs = any(bool(document.get(name)) for name in LOGPROBS_MEMBERS)
    return RequestFacts(
        model,
        bool(stream),
        include_usage,
        max_tokens,
        n,
        estimate_text_tokens(prompt),
        logprobs,
        has_stream_options="stream_options" in document,
    )


def inspected(body: bytes, limit: int) -> RequestFacts | str:
    try:
        return inspect_request(body, max_output_tokens=limit)
    except BodyError as exc:
        return exc.problem


def typed(answer: RequestFacts | str) -> object:
    """Comparable without `True == 1`: each field with its type."""
    if isinstance(answer, str):
        return answer
    return [(type(value), value) for value in astuple(answer)]


# ----- inspect_request -----------------------------------------------------------------------

near_json_bytes = request_objects.map(lambda doc: json.dumps(doc).encode()).flatmap(
    lambda raw: st.tuples(st.integers(0, len(raw)), st.binary(max_size=3)).map(
        lambda cut: raw[: cut[0]] + cut[1] + raw[cut[0] :]
    )
)


@FUZZ
@given(body=st.binary(max_size=200) | near_json_bytes, limit=limits)
def test_inspect_request_raises_only_body_errors(body: bytes, limit: int):
    got = inspected(body, limit)  # anything but BodyError fails the test
    try:
        document = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        assert got == "json"
        return
    if got == "duplicate":  # json.loads keeps the last duplicate instead
        return
    expected = oracle(document, limit)
    if isinstance(got, RequestFacts) and isinstance(expected, RequestFacts):
        # The body's layout is arbitrary here, so its prompt estimate is not predictable
        # from json.loads' values; the other properties test it.
        got = replace(got, prompt_tokens=expected.prompt_tokens)
    assert typed(got) == typed(expected)


@FUZZ
@given(document=request_objects, limit=limits, ensure_ascii=st.booleans())
def test_inspect_request_agrees_with_json_loads(
    document: dict[str, Any], limit: int, ensure_ascii: bool
):
    body = json.dumps(document, ensure_ascii=ensure_ascii).encode()
    expected = oracle(json.loads(body), limit, ensure_ascii=ensure_ascii)
    assert typed(inspected(body, limit)) == typed(expected)


messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=40)}
    ),
    min_size=1,
    max_size=4,
)
valid_requests = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=12), "messages": messages},
    optional={
        "stream": st.booleans() | st.none(),
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
        "max_tokens": st.integers(1, 4096) | st.none(),
        "max_completion_tokens": st.integers(1, 4096),
        "n": st.integers(1, MAX_N),
        "tools": st.lists(st.fixed_dictionaries({"type": st.just("function")}), max_size=2),
        "temperature": st.floats(0, 2),
    },
)
layouts = st.sampled_from(
    [{}, {"indent": 2}, {"separators": (",", ":")}, {"ensure_ascii": False, "indent": "\t"}]
)


@FUZZ
@given(document=valid_requests, layout=layouts)
def test_valid_requests_are_read_as_json_loads_reads_them(
    document: dict[str, Any], layout: dict[str, Any]
):
    body = json.dumps(document, **layout).encode()
    got = inspect_request(body, max_output_tokens=4096)
    loaded = json.loads(body)
    assert got.model == loaded["model"]
    assert got.stream is (loaded.get("stream") is True)
    assert got.include_usage is (loaded.get("stream_options", {}).get("include_usage") is True)
    expected_max = loaded.get("max_completion_tokens", loaded.get("max_tokens"))
    assert got.max_tokens == expected_max
    assert got.n == loaded.get("n", 1)
    assert type(got.n) is int and type(got.max_tokens) in (int, type(None))
    # Layout adds ASCII whitespace and escapes (an escaped character costs 1.5 or 3,
    # a raw one 1): never fewer tokens than the most compact form of the same request.
    tightest = "".join(
        json.dumps(loaded[name], separators=(",", ":"), ensure_ascii=False)
        for name in PROMPT_MEMBERS
        if name in loaded
    )
    assert got.prompt_tokens >= estimate_text_tokens(tightest)
    assert got.prompt_tokens <= len(body)


# ----- usage parsers -------------------------------------------------------------------------


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(data)) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def parse(parser: UsageParser, chunks: list[bytes]) -> ObservedUsage:
    for chunk in chunks:
        parser.feed(chunk)
    return parser.finish()


sse_pieces = st.sampled_from(
    [
        b"data:",
        b"data: ",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        b"[DONE]",
        b": c",
        b"event: x",
        b'{"choices":[{"delta":{"content":"x"}}]}',
        b'{"usage":{"prompt_tokens":1,"completion_tokens":2}}',
        b'{"type":"response.completed","response":{"usage":{"input_tokens":3}}}',
        "日😀".encode(),
        b"\xe6\x97",
        b"\xa5",
        b"{",
        b"}",
    ]
)
noisy_bodies = st.binary(max_size=300) | st.lists(sse_pieces | st.binary(max_size=4)).map(b"".join)
cut_lists = st.lists(st.integers(0, 400), max_size=10)
max_sizes = st.integers(4, 80) | st.just(1 << 20)  # small: lines and events hit the limit


@FUZZ
@given(body=noisy_bodies, cuts=cut_lists, max_json_bytes=max_sizes)
def test_sse_parser_never_raises_and_ignores_chunk_boundaries(
    body: bytes, cuts: list[int], max_json_bytes: int
):
    whole = parse(SseUsageParser(max_json_bytes), [body])
    assert parse(SseUsageParser(max_json_bytes), split(body, cuts)) == whole
    assert parse(SseUsageParser(max_json_bytes), split(body, list(range(len(body))))) == whole


json_bodies = st.binary(max_size=200) | json_values.map(lambda value: json.dumps(value).encode())


@FUZZ
@given(body=json_bodies, cuts=cut_lists, max_json_bytes=max_sizes)
def test_json_parser_never_raises_and_ignores_chunk_boundaries(
    body: bytes, cuts: list[int], max_json_bytes: int
):
    whole = parse(JsonUsageParser(max_json_bytes), [body])
    assert parse(JsonUsageParser(max_json_bytes), split(body, cuts)) == whole


@dataclass(frozen=True)
class Event:
    """One generated SSE event and what it should do to the result."""

    raw: str
    content: bool = False
    usage: tuple[int | None, int | None] = (None, None)
    malformed: bool = False


counts = st.integers(0, 10**9) | st.sampled_from([-1, 10**9 + 1, 1.5, True, None])


def _valid(value: Any) -> int | None:
    ok = type(value) is int and 0 <= value <= 10**9
    return value if ok else None


def _content_event(text: str, prefix: str) -> Event:
    document = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return Event(prefix + "data: " + json.dumps(document, ensure_ascii=False), content=text != "")


def _usage_event(prompt: Any, completion: Any) -> Event:
    document = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    return Event("data:" + json.dumps(document), usage=(_valid(prompt), _valid(completion)))


def _split_usage_event(prompt: Any, completion: Any) -> Event:
    """The same JSON over two data lines, which SSE joins with LF (JSON whitespace)."""
    document = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    head, _, rest = json.dumps(document).partition(", ")
    return Event(f"data: {head},\ndata: {rest}", usage=(_valid(prompt), _valid(completion)))


events = st.one_of(
    st.builds(_content_event, st.text(max_size=12), st.sampled_from(["", "event: m\n", "id: 7\n"])),
    st.builds(_split_usage_event, counts, counts),
    st.builds(_usage_event, counts, counts),
    st.just(Event(": keep-alive")),
    st.just(Event("data: {oops", malformed=True)),
)


@FUZZ
@given(
    stream=st.lists(events, max_size=8),
    done=st.booleans(),
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(0, 2000), max_size=12),
)
def test_generated_sse_streams_read_right_however_they_are_cut(
    stream: list[Event], done: bool, newline: str, cuts: list[int]
):
    text = "".join(event.raw + "\n\n" for event in stream)  # no raw LF inside an event's JSON
    if done:
        text += "data: [DONE]\n\n"
    data = text.replace("\n", newline).encode("utf-8")
    input_tokens = output_tokens = None
    for event in stream:
        input_tokens = event.usage[0] if event.usage[0] is not None else input_tokens
        output_tokens = event.usage[1] if event.usage[1] is not None else output_tokens
    expected = ObservedUsage(
        input_tokens,
        output_tokens,
        sum(event.content for event in stream),
        sum(event.malformed for event in stream),
        done,
    )
    assert parse(SseUsageParser(), split(data, cuts)) == expected
    assert parse(SseUsageParser(), split(data, list(range(len(data))))) == expected


# ----- the request record: what json_to_metadata and sse_to_metadata hand over -----------------

usage_members = st.dictionaries(
    st.sampled_from(["prompt_tokens", "completion_tokens", "input_tokens", "output_tokens"]),
    json_scalars | st.integers(min_value=0, max_value=2 * 10**9),
)


# JSON's number grammar (RFC 8259, section 6).
_JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _as_envoy_number(value: Any) -> int | None:
    """A member as the record must take it: JSON numbers reach it as doubles (Envoy's
    json_to_metadata), so a whole number written with a fraction (12.0) counts too; Envoy
    writes a text member as it is, so a text that is a JSON number counts as that number
    (it cannot be told from one)."""
    if isinstance(value, str) and _JSON_NUMBER.fullmatch(value) and len(value) <= 32:
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if math.isfinite(value) and float(value).is_integer() and 0 <= value <= 10**9:
        return int(value)
    return None


def _as_envoy_writes(value: struct_pb2.Value) -> str:
    """A metadata value as Envoy's access log writes it (wire.metadata_field): a string as
    it is, none as "-", anything else as protobuf's JSON."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "null_value":
        return "-"
    return json_format.MessageToJson(value, indent=None)


@given(members=usage_members)
@FUZZ
def test_the_record_reads_usage_members_as_the_body_parser_does(members: dict[str, Any]) -> None:
    """For any usage object, the request record's reading of the metadata json_to_metadata
    writes (formatted by Envoy's access log a key a field) agrees with the body parser's
    reading of the JSON (up to 12.0 and number text above), and never raises."""
    # JSON has no infinities, so Envoy never writes one.
    assume(all(not isinstance(v, float) or math.isfinite(v) for v in members.values()))
    # Text with a newline shifts the fields after it (docs/metrics.md, "The record"):
    # what it can garble is pinned by test_record.py.
    assume(all(not isinstance(v, str) or "\n" not in v for v in members.values()))
    attributes = {}
    if members:
        namespace = struct_pb2.Struct()
        namespace.update(members)  # JSON values as Envoy's PROTOBUF_VALUE type keeps them
        for key, value in namespace.fields.items():
            field = wire.metadata_field(wire.USAGE_METADATA_NAMESPACE, key)
            attributes[field] = _as_envoy_writes(value)
    seen = decode(log_record(attributes), {})

    expected = {k: _as_envoy_number(v) for k, v in members.items()}
    prompt = expected.get("prompt_tokens")
    completion = expected.get("completion_tokens")
    assert seen.input_tokens == (prompt if prompt is not None else expected.get("input_tokens"))
    assert seen.output_tokens == (
        completion if completion is not None else expected.get("output_tokens")
    )
    # Where JSON has true integers, the body parser reads the same.
    if all(not isinstance(v, float | str) for v in members.values()):
        parser = JsonUsageParser(1 << 20)
        parser.feed(json.dumps({"usage": members}).encode())
        body = parser.finish()
        assert (body.input_tokens, body.output_tokens) == (seen.input_tokens, seen.output_tokens)
