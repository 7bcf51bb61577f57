"""The Lua model reader (xds/translate/model_reader.py, the specification) against the
native one (sluicegate/native/c/model_filter.c with model_walk.c) on the same few thousand
random requests: both must write the same things.

The Lua side runs the translator's source (model_reader_lua of FACTS) under lupa, its
`handle` a stub of Envoy's Lua API as the reader uses it (written in Lua below: headers
whose `get` joins a repeated header's values with ",", as Envoy's does; a body whose
`getBytes` gives raw bytes and whose `setBytes` sets content-length; the dynamic
metadata, each value with its Lua type; the route cache cleared). The C side is the mock
of Envoy in model_harness.c (its `replay` mode), the filter configured with the
translator's configuration of the same FACTS (model_reader_config), each request sent
whole (its body in one data frame that ends the stream).

The requests are made from a seed (tenants', exact-lane, unknown and malformed clients;
priority and scenario headers, repeated, padded, in another case; generation and other
paths; chat bodies of every member the reader reads, valid and not, then mutated), and
compared one by one: the metadata written (each key's value, its type and how often it
was written), the headers set (each one's calls and value), the body after a splice and
the route cache cleared. The differences docs/native-filters.md ("The model reader")
documents are excused, each by its own rule below; out of memory is not exercised.
"""

from __future__ import annotations

import importlib
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import pytest

from sluicegate import wire
from sluicegate.config import LANE_EXACT, LANE_FAST
from sluicegate.filters.request_limits import without_query_credentials
from sluicegate.local_replies import (
    DUPLICATE_PREFIX,
    INVALID_PRIORITY,
    MAX_TOKENS_PREFIX,
    MODEL_NOT_ALLOWED,
    UNKNOWN_CLIENT,
)
from sluicegate.xds.translate.model_reader import META_BODY_PROBLEM, model_reader_lua
from tests.native.mock_envoy import build_mock, run_mock
from tests.native.test_model_filter import CONFIG, FACTS, HARNESS, SOURCES

SEED: Final = 20260611
REQUESTS: Final = 3000
# A mismatch report groups the mismatches and shows the smallest request of this many.
SHOWN: Final = 5

NAMESPACE: Final = wire.METADATA_NAMESPACE.encode()
CLIENT: Final = wire.CLIENT_HEADER.encode()
PRIORITY: Final = wire.PRIORITY_HEADER.encode()
SCENARIO: Final = wire.SCENARIO_HEADER.encode()
USAGE: Final = wire.USAGE_HEADER.encode()
PATH: Final = b":path"
CONTENT_LENGTH: Final = b"content-length"
PROBLEM: Final = META_BODY_PROBLEM.encode()
# The walk's bound (model_walk.c's MAX_DEPTH): deeper nesting is refused as not JSON.
MAX_DEPTH: Final = 65536

# Envoy's Lua API as the reader uses it (Lua 5.1): one request's headers (`list`: names and
# values in turn, the names in lower case, as Envoy keeps them) and body (nil: the request
# ended with its headers). Strict where Envoy is: a header name or value, a body's bytes,
# getBytes' bounds (luaL_checkstring takes a number as its text, as Envoy does). Returns
# the metadata set (namespace, key, type, value in turn), the headers set (name, value in
# turn; setBytes sets content-length), the route cache's clears, the body setBytes set
# (nil: none) and the error envoy_on_request raised (nil: none).
DRIVER: Final = rb"""
return function(list, body)
  local store = {}
  for i = 1, #list, 2 do store[#store + 1] = {list[i], list[i + 1]} end
  local meta, set, clears, spliced = {}, {}, 0, nil
  local function text(value)
    if type(value) == "number" then return tostring(value) end
    if type(value) ~= "string" then error("string expected, got " .. type(value), 3) end
    return value
  end
  local headers = {}
  function headers:get(name)
    name = string.lower(text(name))
    local values = {}
    for _, h in ipairs(store) do
      if h[1] == name then values[#values + 1] = h[2] end
    end
    if #values == 0 then return nil end
    return table.concat(values, ",")
  end
  function headers:replace(name, value)
    name, value = string.lower(text(name)), text(value)
    local kept = {}
    for _, h in ipairs(store) do
      if h[1] ~= name then kept[#kept + 1] = h end
    end
    kept[#kept + 1] = {name, value}
    store = kept
    set[#set + 1] = name
    set[#set + 1] = value
  end
  local buffer = nil
  if body ~= nil then
    buffer = {}
    function buffer:length() return #body end
    function buffer:getBytes(start, length)
      if type(start) ~= "number" or type(length) ~= "number" or start < 0 or length < 0
          or start + length > #body then
        error("index/length must be >= 0 and (index + length) must be <= buffer size", 2)
      end
      return string.sub(body, start + 1, start + length)
    end
    function buffer:setBytes(bytes)
      body = text(bytes)
      spliced = body
      headers:replace("content-length", tostring(#body))
    end
  end
  local metadata = {}
  function metadata:set(namespace, key, value)
    meta[#meta + 1] = text(namespace)
    meta[#meta + 1] = text(key)
    meta[#meta + 1] = type(value)
    if value == nil then value = false end
    meta[#meta + 1] = value
  end
  local info = {}
  function info:dynamicMetadata() return metadata end
  local handle = {}
  function handle:headers() return headers end
  function handle:body() return buffer end
  function handle:streamInfo() return info end
  function handle:clearRouteCache() clears = clears + 1 end
  local ok, err = pcall(envoy_on_request, handle)
  return meta, set, clears, spliced, (not ok) and tostring(err) or nil
end
"""


# ---- what a reader wrote ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Written:
    """What one reader did to one request: each metadata key's (type, last value, writes),
    each header it set (calls, value now), the body sent on when it is not the one sent
    (a splice), the route cache's clears, and the Lua error (never the C's)."""

    meta: dict[bytes, tuple[str, object, int]] = field(default_factory=dict)
    headers: dict[bytes, tuple[int, bytes | None]] = field(default_factory=dict)
    body: bytes | None = None
    clears: int = 0
    error: str | None = None

    def value(self, key: str) -> object:
        entry = self.meta.get(key.encode())
        return None if entry is None else entry[1]

    def show(self) -> str:
        def text(value: object) -> str:
            return _cut(value, 120) if isinstance(value, bytes) else repr(value)

        lines = [f"  meta {key!r} = {kind} {text(value)} (x{writes})"
                 for key, (kind, value, writes) in self.meta.items()]  # fmt: skip
        lines += [f"  header {name!r} = {text(value)} (x{sets})"
                  for name, (sets, value) in self.headers.items()]  # fmt: skip
        lines.append(f"  clears {self.clears}")
        if self.body is not None:
            lines.append(f"  body {_cut(self.body, 300)}")
        if self.error is not None:
            lines.append(f"  error {self.error}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Request:
    """Headers in order (names in lower case, as Envoy keeps them), and the body (None: the
    request ends with its headers)."""

    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes | None

    def header(self, name: bytes) -> bytes | None:
        """Envoy's Lua `get`: the values joined with ","; None when absent."""
        values = [value for key, value in self.headers if key == name]
        return b",".join(values) if values else None

    def line(self) -> str:
        """The harness's replay line (model_harness.c, mode_replay)."""
        body = "-" if self.body is None else self.body.hex() or "."
        return " ".join([body, *(f"{name.hex()}:{value.hex()}" for name, value in self.headers)])

    def show(self) -> str:
        headers = ", ".join(f"{name!r}: {_cut(value, 120)}" for name, value in self.headers)
        body = "None" if self.body is None else _cut(self.body, 2000)
        return f"  headers {{{headers}}}\n  body {body}"


def _cut(value: bytes, most: int) -> str:
    return repr(value) if len(value) <= most else f"{value[:most]!r} … ({len(value)} bytes)"


# ---- the Lua side -----------------------------------------------------------------------


def lua_module() -> tuple[ModuleType, str]:
    """lupa's LuaJIT runtime if the wheel has one (Envoy's Lua filter is LuaJIT 2.1),
    else its Lua 5.1 (the same semantics the reader is written for); skips without lupa."""
    pytest.importorskip("lupa")
    for name in ("lupa.luajit21", "lupa.luajit20", "lupa.lua51"):
        try:
            return importlib.import_module(name), name
        except ImportError:
            continue
    pytest.skip("lupa has no LuaJIT nor Lua 5.1 runtime")


class LuaReader:
    """The translator's Lua source in one runtime; strings are bytes both ways
    (encoding=None), so a body's non-UTF-8 bytes reach the reader as they are."""

    def __init__(self, source: str) -> None:
        module, self.runtime_name = lua_module()
        self.lua: Any = module.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self.lua.execute(source.encode())
        self.drive: Any = self.lua.execute(DRIVER)
        self.tonumber: Any = self.lua.eval(b"tonumber")

    def read(self, request: Request) -> Written:
        flat = [part for pair in request.headers for part in pair]
        meta_list, set_list, clears, spliced, error = self.drive(
            self.lua.table(*flat), request.body
        )
        meta: dict[bytes, tuple[str, object, int]] = {}
        items = _array(meta_list)
        for at in range(0, len(items), 4):
            namespace, key, kind, value = items[at : at + 4]
            if namespace != NAMESPACE:  # the C's mock writes one namespace only
                key = namespace + b":" + key
            writes = meta[key][2] + 1 if key in meta else 1
            meta[key] = (kind.decode(), value, writes)
        headers: dict[bytes, tuple[int, bytes | None]] = {}
        pairs = _array(set_list)
        for at in range(0, len(pairs), 2):
            name, value = pairs[at], pairs[at + 1]
            headers[name] = (headers[name][0] + 1 if name in headers else 1, value)
        body = spliced if spliced is not None and spliced != request.body else None
        text = None if error is None else error.decode(errors="replace")
        return Written(meta, headers, body, int(clears), text)

    def is_zero(self, raw: bytes) -> bool:
        """Lua's `tonumber(raw) == 0`, as the reader asks of a log-probabilities value."""
        return bool(self.tonumber(raw) == 0)


def _array(table: Any) -> list[Any]:
    return [table[i] for i in range(1, len(table) + 1)]


# ---- the C side -------------------------------------------------------------------------


def _unhex(token: str) -> bytes:
    return b"" if token == "." else bytes.fromhex(token)


def parse_replay(line: str) -> Written:
    """One line of the harness's replay output (model_harness.c, mode_replay)."""
    tokens = line.split(" ")
    meta: dict[bytes, tuple[str, object, int]] = {}
    headers: dict[bytes, tuple[int, bytes | None]] = {}
    body, clears, at = None, 0, 0
    while at < len(tokens):
        tag = tokens[at]
        if tag == "C":
            clears, at = int(tokens[at + 1]), at + 2
        elif tag == "M":
            key, writes, kind, raw = tokens[at + 1 : at + 5]
            value: object = raw == "1" if kind == "b" else _unhex(raw)
            meta[_unhex(key)] = ("boolean" if kind == "b" else "string", value, int(writes))
            at += 5
        elif tag == "H":
            name, sets, raw = tokens[at + 1 : at + 4]
            headers[_unhex(name)] = (int(sets), None if raw == "-" else _unhex(raw))
            at += 4
        elif tag == "B":
            body, at = _unhex(tokens[at + 1]), at + 2
        else:
            raise AssertionError(f"not a replay line: {line[:200]!r}")
    return Written(meta, headers, body, clears)


def replay(harness: Path, requests: Sequence[Request]) -> list[Written]:
    stdin = CONFIG.encode().hex() + "\n" + "".join(rq.line() + "\n" for rq in requests)
    lines = run_mock(harness, "replay", stdin=stdin).splitlines()
    assert len(lines) == len(requests)
    return [parse_replay(line) for line in lines]


# ---- the documented differences ---------------------------------------------------------

_JSON_NUMBER: Final = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_LOGPROBS_RAW: Final = re.compile(
    rb'"(?:' + b"|".join(re.escape(m.encode()) for m in wire.LOGPROBS_MEMBERS)
    + rb')"[ \t\r\n]*:[ \t\r\n]*([^,}\] \t\r\n\v\f]+)'
)  # fmt: skip


def nesting(body: bytes) -> int:
    """The deepest nesting of the body's brackets outside strings (the walk's count)."""
    depth = deepest = 0
    at = 0
    while at < len(body):
        c = body[at]
        if c == 0x22:  # a string: to its closing quote (one after an even run of backslashes)
            end = at
            while True:
                end = body.find(b'"', end + 1)
                if end < 0:
                    return deepest
                before = end
                while before > at + 1 and body[before - 1] == 0x5C:
                    before -= 1
                if (end - before) % 2 == 0:
                    break
            at = end
        elif c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in b"]}":
            depth -= 1
        at += 1
    return deepest


def documented(request: Request, lua: Written, native: Written, reader: LuaReader) -> str | None:
    """Which documented difference (docs/native-filters.md, "The model reader") explains
    these two outcomes, or None."""
    body = request.body or b""
    # Nesting deeper than 65,536 levels: refused as not JSON by the native reader only.
    if native.value(META_BODY_PROBLEM) == b"json" and nesting(body) > MAX_DEPTH:
        return "nesting"
    # A log-probabilities value that is a zero in a form JSON does not allow (`0x0`, `00`,
    # `0.`, `.0`, `+0` …): Lua's tonumber reads a zero (usage read from the log), the
    # native reader asks (none): the usage header alone differs. (The value is looked for
    # anywhere in the body, not only at its top level: loose, but only with that one
    # difference.)
    usage_lua, usage_c = lua.headers.get(USAGE), native.headers.get(USAGE)
    if (
        usage_lua == (1, wire.USAGE_BY_LOG.encode())
        and usage_c == (1, wire.USAGE_UNREAD.encode())
        and replace(native, headers={**native.headers, USAGE: usage_lua}) == lua
        and any(
            _JSON_NUMBER.match(raw) is None and reader.is_zero(raw)
            for raw in _LOGPROBS_RAW.findall(body)
        )
    ):
        return "logprobs zero"
    # A log-probabilities value of zero written with an exponent of 2^20 or more
    # (`0e1048576`, JSON): LuaJIT's tonumber gives nil, so the Lua reader reads it as
    # asked (none); the native reader, as a provider's parser, as zero (log).
    if (
        usage_lua == (1, wire.USAGE_UNREAD.encode())
        and usage_c == (1, wire.USAGE_BY_LOG.encode())
        and replace(native, headers={**native.headers, USAGE: usage_lua}) == lua
        and any(
            _JSON_NUMBER.match(raw) is not None and reader.tonumber(raw) is None
            for raw in _LOGPROBS_RAW.findall(body)
        )
    ):
        return "logprobs huge exponent"
    return None


# ---- the requests -----------------------------------------------------------------------

TENANTS: Final = tuple(name.encode() for name in sorted(FACTS.tenants))
KEY_NAMES: Final = (b"k1", b"k2", b"key-7", b"k 1", b"cl\xc3\xa9", b"k,1", b"k\tx", b"K")
MALFORMED_CLIENTS: Final = (
    b"", b"fast", b"fast/acme", b"fast/acme/k1/x", b"fast//k1", b"fast/acme/", b"/acme/k1",
    b"abc", b"fast/acme/k1/", b" fast/acme/k1", b"fast/Acme/k1", b"Fast/acme/k1",
    b"fast/nobody/k", b"other/acme/k1", b"fast/acme /k1", b"exact//k", b"exact/acme/",
    b"fast/acm\xc3\xa9/k1", b"//", b"fast/beta",
)  # fmt: skip
PRIORITIES: Final = (
    b"interactive", b"standard", b"batch", b" Batch\t", b"BATCH", b"Standard ", b"bogus", b"",
    b",", b"batch,", b"a,interactive", b"\x0b", b"gold, batch \x0b", b"\x0cbatch\x0c",
    b"b\xc3\xa4tch", b"INTERACTIVE", b"standard,batch", b" , ", b"batch" * 14, b"inter active",
)  # fmt: skip
SCENARIOS: Final = (b"s1", b"", b"a,b", b"x y", b"s" * 100, b"\xc3\xa9" * 50, b"long-" * 17)
PATHS: Final = (
    b"/v1/chat/completions", b"/v1/chat/completions?x=1", b"/v1/chat/completions/",
    b"/v1/chat/completions//?a=/b", b"/chat/completions", b"/v1/completions",
    b"/v1/completions/?stream=1", b"/v1/responses", b"/v1/responses?x", b"/v1/embeddings",
    b"/v1/models", b"", b"?", b"/?/v1/completions", b"/v1/chat/completionsx",
    b"/v1/CHAT/completions", b"/openai/deployments/x/chat/completions?api-version=1",
)  # fmt: skip
# Query parameters: credentials in every spelling the routing stage's rule reads as one
# (filters/request_limits.py), and near misses it keeps.
QUERY_PARTS: Final = (
    b"api_key=sk-1", b"key=k", b"API-Key=x", b"api%5Fkey=x", b"api%5fKEY", b"+api_key+=x",
    b"%20token%09=x", b"\x0bsig\x0c=1", b"api key=x", b"api+key=x", b"x_api-key=",
    b"subscription-key=s", b"Code=1", b"tok%65n=t", b"limit=5", b"q=a%26api_key%3Dsk",
    b"flag", b"", b"=x", b"api_key%3Dx=1", b"%zz=1", b"%4", b"api%2", b"key%", b"%%6bey=1",
    b"%256bey=1", b"\xc2\xa0api_key=x", b"%C2%A0api_key=x", b"tokenx=1", b"%00key=1",
    b"key%00=1", b"k" * 70 + b"=1", b"api_key==", b"secret=a=b", b"?key=1", b"a?b=key",
    b"+" * 70 + b"key=1", b"%20" * 30 + b"token" + b"%09" * 30, b"a" + b"+" * 3000 + b"b=1",
)  # fmt: skip

MODELS: Final = (
    b'"gpt-4o"', b'"gpt-4o-mini"', b'"org/m1"', b'"held-model"', b'"org\\/m1"',
    b'"held\\/model"', b'"gpt-4o"', b'"gpt-4o-mini"', b'"org/m1"', b'"held-model"',
)  # fmt: skip
ODD_MODELS: Final = (
    b'"other-model"', b'""', b'"GPT-4O"', b'"mod\xc3\xa8le"', b'"\\/org\\/m1\\/"',
    b'"org\\\\/m1"', b'"gpt-4o\\n"', b'"gpt\\u002d4o"', b'"a\\"b"', b'"\\\\"', b'"x\\\\"',
    b'"' + b"m" * 300 + b'\\/x"', b'"\xff\xfe"', b'"gpt-4o "', b'"org\\/\\/m1"',
    b"1", b"null", b"true", b"[]", b"{}", b'["gpt-4o"]', b'{"a":1}', b"1.5", b"-0", b"gpt-4o",
)  # fmt: skip
STREAMS: Final = (b"true", b"true", b"true", b"false", b"null")
ODD_STREAMS: Final = (b'"true"', b"1", b"0", b"TRUE", b"tru", b"[]", b"{}", b"true0", b'""')
STREAM_OPTIONS: Final = (b"null", b'{"include_usage":true}', b"{}", b"false", b'{"a":[1]}')
ODD_COUNTS: Final = (
    b"0", b"-1", b"1.5", b"1e3", b"100.0", b'"100"', b"100000000000000000000",
    b"123456789012345", b"1234567890123456", b"007", b"null", b"true", b"[]", b"-0", b"+5",
    b"4097", b"129", b"0x10", b"1 ", b"9" * 15, b"",
)  # fmt: skip
LOGPROBS: Final = (
    b"true", b"false", b"null", b"0", b"1", b'""', b'"x"', b"[]", b"[ ]", b"{}", b"{ }",
    b"[1]", b"0.0", b"-0", b"0e5", b"1e-400", b"2", b"-0.0E-0", b"2.4e-324", b"2.5e-324",
    b'"0"', b"[\x0b]", b"{\x0c}", b"1e400", b"0.000000000000000000000000001", b"nan", b"inf",
    b"0e", b"-", b"0x0", b"00", b"0.", b".0", b"+0", b"0x1", b"-0x0", b"0x0p0", b"1.",
    b"20", b"[[]]", b"0e1048576", b"-0E+99999999", b"1e-1048576", b"0.0e-2000000",
)  # fmt: skip
TEXTS: Final = (
    b"hello", b"caf\xc3\xa9", b"\xe2\x82\xac 5", b"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
    b"\xf0\x9f\x98\x80 ok", b'say \\"hi\\"', b"back\\\\slash", b"line\\nbreak", b"\\u00e9t\\u00e9",
    b"\xff\xfe raw", b"\xc3", b"\x80\x80\x80\x80\x80", b"tab\there", b"", b"{[}]",
    b"x" * 500, b"\xc3\xa9" * 200,
)  # fmt: skip
OTHERS: Final = (
    (b"temperature", b"0.7"), (b"user", b'"u-1"'), (b"metadata", b'{"k":"v","model":"x"}'),
    (b"seed", b"42"), (b"response_format", b'{"type":"json_object"}'),
    (b"tool_choice", b'"auto"'), (b"extra", b"[1,[2,[3,{\"n\":[]}]]]"),
    (b"parallel_tool_calls", b"false"), (b"models", b'"gpt-4o"'), (b"streams", b"true"),
    (b"stop", b'["\\"}", "]"]'), (b"x", b'"\\\\"'), (b"empty", b'""'), (b"neg", b"-1.5e-3"),
)  # fmt: skip
# Keys a provider's parser may read as a member the reader reads: refused as not JSON.
RECASED: Final = (
    b"Model", b"MODEL", b"Stream", b"N", b"Max_Tokens", b"Messages", b"TOP_LOGPROBS",
    b"Stream_Options", b"INPUT",
)  # fmt: skip
ESCAPED_KEYS: Final = (
    b"mod\\u0065l", b"\\u006e", b"x\\u0041", b"stream\\/", b"mod\xc3\xa9l", b"\\\\", b"a\\\"b",
)  # fmt: skip
NON_OBJECTS: Final = (
    b"[1,2]", b'"model"', b"-0.5e+3", b"01", b"1.", b".5", b"true", b"null", b"nul", b"tru",
    b"1e5 ", b" 42 ", b"[", b"]", b"}", b'"unterminated', b"[1,{]", b"\x0b{}", b"{}", b"{ }",
    b"{}x", b"  ", b"\t\r\n", b'[{"model":"gpt-4o"}]', b"0", b"-", b"1e", b"\"\\\"\"", b"{",
    b"\xef\xbb\xbf{}", b"false\x0b", b"[]\n", b"{}}", b"{,}", b'{"model"}', b'{"model":}',
    b'{"model":"gpt-4o",}', b'{"model":"gpt-4o"', b'{"model" "gpt-4o"}', b"123abc",
)  # fmt: skip
SPACES: Final = (b"", b"", b"", b" ", b"\n  ", b"\t", b"\r\n")


def _space(rng: random.Random) -> bytes:
    if rng.random() < 0.002:  # not JSON's: a scalar ends at it, then it is refused
        return rng.choice((b"\x0b", b"\x0c", b"\xa0"))
    return rng.choice(SPACES)


def _string(text: bytes) -> bytes:
    return b'"' + text + b'"'


def _count(rng: random.Random, most: int) -> bytes:
    roll = rng.random()
    if roll < 0.6:
        return str(rng.randint(1, min(most, 64) if rng.random() < 0.7 else most)).encode()
    if roll < 0.75:
        return str(rng.choice((1, most, most - 1))).encode()
    return rng.choice(ODD_COUNTS)


def _message(rng: random.Random) -> bytes:
    role = rng.choice((b"user", b"system", b"assistant"))
    return b'{"role":"' + role + b'","content":' + _string(rng.choice(TEXTS)) + b"}"


def _prompt_value(rng: random.Random, name: bytes) -> bytes:
    if name == b"messages":
        return b"[" + b",".join(_message(rng) for _ in range(rng.randint(0, 3))) + b"]"
    if name in (b"tools", b"functions"):
        tool = b'{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}'
        return b"[" + b",".join(tool for _ in range(rng.randint(0, 2))) + b"]"
    roll = rng.random()
    if roll < 0.6:
        return _string(rng.choice(TEXTS))
    if roll < 0.8:
        return b"[" + b",".join(_string(rng.choice(TEXTS)) for _ in range(rng.randint(0, 3))) + b"]"
    return rng.choice((b"null", b"12", b'{"a":"\xc3\xa9"}', b"[[1,2],[3]]"))


def _members(rng: random.Random) -> list[tuple[bytes, bytes]]:
    """A chat request's members as (key, raw value), in a random order."""
    members: list[tuple[bytes, bytes]] = []
    if rng.random() < 0.95:
        model = rng.choice(MODELS) if rng.random() < 0.85 else rng.choice(ODD_MODELS)
        members.append((b"model", model))
    if rng.random() < 0.6:
        members.append((b"stream", rng.choice(STREAMS if rng.random() < 0.85 else ODD_STREAMS)))
    if rng.random() < 0.2:
        members.append((b"stream_options", rng.choice(STREAM_OPTIONS)))
    for cap in wire.MAX_TOKENS_MEMBERS:
        if rng.random() < 0.2:
            members.append((cap.encode(), _count(rng, FACTS.max_output_tokens)))
    if rng.random() < 0.2:
        members.append((b"n", _count(rng, wire.MAX_N)))
    for name in wire.LOGPROBS_MEMBERS:
        if rng.random() < 0.2:
            members.append((name.encode(), rng.choice(LOGPROBS)))
    if rng.random() < 0.75:
        members.append((b"messages", _prompt_value(rng, b"messages")))
    for name in wire.PROMPT_MEMBERS[1:]:
        if rng.random() < 0.12:
            members.append((name.encode(), _prompt_value(rng, name.encode())))
    for _ in range(rng.choice((0, 0, 1, 2, 3))):
        members.append(rng.choice(OTHERS))
    rng.shuffle(members)
    return members


def _object(rng: random.Random, members: Sequence[tuple[bytes, bytes]]) -> bytes:
    parts = [
        _space(rng) + _string(key) + _space(rng) + b":" + _space(rng) + value + _space(rng)
        for key, value in members
    ]
    inner = b",".join(parts) if parts else _space(rng)
    return _space(rng) + b"{" + inner + b"}" + _space(rng)


def _mutated_members(rng: random.Random, members: list[tuple[bytes, bytes]]) -> None:
    """A member repeated, or a key recased or escaped."""
    roll = rng.random()
    if roll < 0.5 and members:
        copy = rng.choice(members)
        if rng.random() < 0.5:
            copy = (copy[0], rng.choice((b"1", b'"x"', b"null", copy[1])))
        members.insert(rng.randint(0, len(members)), copy)
    elif roll < 0.8:
        members.insert(rng.randint(0, len(members)), (rng.choice(RECASED), b'"x"'))
    else:
        members.insert(rng.randint(0, len(members)), (rng.choice(ESCAPED_KEYS), b"1"))


def _mutated_bytes(rng: random.Random, body: bytes) -> bytes:
    """Truncated, trailing text, random bytes, a byte changed, a range deleted or doubled,
    brackets added, wrapped."""
    at = rng.randint(0, len(body))
    roll = rng.randrange(9)
    if roll == 0:
        return body[:at]
    if roll == 1:
        return body + rng.choice((b" x", b"}", b",", b"\n", b" \x0b", b"{}", b"\x00", b"]"))
    if roll == 2:
        return body[:at] + rng.randbytes(rng.randint(1, 8)) + body[at:]
    if roll == 3 and body:
        i = rng.randrange(len(body))
        new = rng.choice(b'{}[]",:\\ ') if rng.random() < 0.7 else rng.randrange(256)
        return body[:i] + bytes([new]) + body[i + 1 :]
    if roll == 4 and body:
        end = rng.randint(at, min(len(body), at + 20))
        return body[:at] + body[end:]
    if roll == 5:
        return body[:at] + bytes(rng.choice(b'[]{}"') for _ in range(rng.randint(1, 4))) + body[at:]
    if roll == 6 and body:
        end = rng.randint(at, min(len(body), at + 40))
        return body[:end] + body[at:end] + body[end:]
    if roll == 7:
        return b"[" + body + b"]"
    return body.replace(b'"', b"'", 1)


def _deep(rng: random.Random) -> bytes:
    """Deep nesting: mostly modest, some about the walk's bound (some past it), a wrong
    closer now and then; inside a chat request or at the top level."""
    roll = rng.random()
    if roll < 0.5:
        depth = rng.randint(1, 3000)
    elif roll < 0.8:
        depth = rng.randint(MAX_DEPTH - 4, MAX_DEPTH)
    else:
        depth = rng.randint(MAX_DEPTH + 1, MAX_DEPTH + 4)
    arrays = [rng.random() < 0.85 for _ in range(depth)] if depth < 5000 else [True] * depth
    opened = b"".join(b"[" if a else b'{"a":' for a in arrays)
    closed = b"".join(b"]" if a else b"}" for a in reversed(arrays))
    value = opened + closed
    if rng.random() < 0.2:
        i = len(opened) + rng.randrange(len(closed))
        value = value[:i] + (b"}" if value[i] == 0x5D else b"]") + value[i + 1 :]
    if rng.random() < 0.2:
        return value
    model = rng.choice(MODELS)
    return b'{"model":' + model + b',"stream":true,"messages":' + value + b"}"


def _long(rng: random.Random) -> bytes:
    """A long prompt of escapes and non-ASCII text (the estimate's counts)."""
    pieces = (b"a", b"a", b"a", b"a", b"\\\\", b'\\"', b"\xc3\xa9", b"\xe2\x82\xac", b"\xff")
    text = b"".join(rng.choice(pieces) for _ in range(rng.randint(1000, 60000)))
    name = rng.choice(wire.PROMPT_MEMBERS).encode()
    return b'{"model":' + rng.choice(MODELS) + b',"' + name + b'":"' + text + b'"}'


def make_body(rng: random.Random) -> bytes | None:
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.07:
        return b""
    if roll < 0.11:
        return rng.choice(NON_OBJECTS)
    if roll < 0.13:
        return rng.randbytes(rng.randint(1, 64))
    if roll < 0.143:
        return _deep(rng)
    if roll < 0.15:
        return _long(rng)
    members = _members(rng)
    if rng.random() < 0.15:
        _mutated_members(rng, members)
    body = _object(rng, members)
    if rng.random() < 0.15:
        for _ in range(rng.randint(1, 3)):
            body = _mutated_bytes(rng, body)
    return body


def _client(rng: random.Random) -> list[bytes]:
    """The client header's values (none: absent)."""
    roll = rng.random()
    if roll < 0.5:
        key = rng.choice(KEY_NAMES)
        if rng.random() < 0.02:  # longer than validation lets a key name be (63)
            key = b"k" * rng.randint(200, 300)
        return [LANE_FAST.encode() + b"/" + rng.choice(TENANTS) + b"/" + key]
    if roll < 0.58:
        tenant = rng.choice((*TENANTS, b"nobody", b"x"))
        return [LANE_EXACT.encode() + b"/" + tenant + b"/" + rng.choice(KEY_NAMES)]
    if roll < 0.7:
        return [rng.choice(MALFORMED_CLIENTS)]
    if roll < 0.75:  # repeated: Envoy's `get` joins them
        first = b"fast/acme/k1"
        return [first, rng.choice((first, b"", b"x", b"exact/acme/k1"))][:: rng.choice((1, -1))]
    return []


def _path(rng: random.Random) -> bytes:
    """A path, half of them with a query of QUERY_PARTS after the path's own."""
    path = rng.choice(PATHS)
    if rng.random() < 0.5:
        return path
    parts = b"&".join(rng.choice(QUERY_PARTS) for _ in range(rng.randint(1, 4)))
    return path + (b"&" if b"?" in path else b"?") + parts


def make_request(rng: random.Random) -> Request:
    headers: list[tuple[bytes, bytes]] = []
    if rng.random() < 0.92:
        headers.append((PATH, _path(rng)))
    headers += [(CLIENT, value) for value in _client(rng)]
    if rng.random() < 0.45:
        headers += [(PRIORITY, rng.choice(PRIORITIES)) for _ in range(rng.choice((1, 1, 2, 3)))]
    if rng.random() < 0.35:
        headers += [(SCENARIO, rng.choice(SCENARIOS)) for _ in range(rng.choice((1, 1, 2)))]
    if rng.random() < 0.1:
        headers.append((USAGE, wire.USAGE_BY_OBSERVER.encode()))
    rng.shuffle(headers)
    return Request(tuple(headers), make_body(rng))


def make_requests(seed: int, count: int) -> list[Request]:
    rng = random.Random(seed)
    return [make_request(rng) for _ in range(count)]


# ---- outcomes ---------------------------------------------------------------------------


def outcome(request: Request, written: Written) -> str:
    """The class of what the (Lua) reader did."""
    problem = written.value(META_BODY_PROBLEM)
    client = request.header(CLIENT) or b""
    if written.error is not None:
        return "lua error"
    if isinstance(problem, bytes):
        text = problem.decode()
        for prefix in (DUPLICATE_PREFIX, MAX_TOKENS_PREFIX):
            if text.startswith(prefix):
                return "refused " + prefix + "*"
        return "refused " + text
    if CLIENT in written.headers:
        return "held"
    if written.value(wire.META_USAGE_INJECTED) is not None:
        return "spliced"
    if written.value(wire.META_MODEL) is not None:
        return "routed"
    if client.startswith(LANE_EXACT.encode() + b"/") and not written.meta:
        return "exact lane"
    if not request.body:
        return "no body"
    return "other"


EXPECTED: Final = (
    "routed", "spliced", "held", "exact lane", "no body", "refused " + UNKNOWN_CLIENT.problem,
    "refused json", "refused object", "refused model", "refused model_type", "refused stream",
    "refused n", "refused " + DUPLICATE_PREFIX + "*", "refused " + MAX_TOKENS_PREFIX + "*",
    "refused " + MODEL_NOT_ALLOWED.problem, "refused " + INVALID_PRIORITY.problem,
)  # fmt: skip


# ---- the test ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lua_reader() -> LuaReader:
    return LuaReader(model_reader_lua(FACTS))


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("model_replay") / "harness"
    return build_mock(HARNESS, SOURCES, target)


Mismatch = tuple[int, Request, Written, Written]


def _differs(lua: Written, native: Written) -> tuple[str, ...]:
    """What differs: metadata keys, headers, the body, the clears, an error."""
    fields = [f"meta {key.decode(errors='replace')}" for key in sorted({*lua.meta, *native.meta})
              if lua.meta.get(key) != native.meta.get(key)]  # fmt: skip
    fields += [f"header {name.decode(errors='replace')}"
               for name in sorted({*lua.headers, *native.headers})
               if lua.headers.get(name) != native.headers.get(name)]  # fmt: skip
    fields += [name for name, differs in (
        ("body", lua.body != native.body), ("clears", lua.clears != native.clears),
        ("lua error", lua.error is not None)) if differs]  # fmt: skip
    return tuple(fields)


def _report(mismatches: list[Mismatch]) -> str:
    """The mismatches grouped by what each reader did and what differs; the smallest
    request of each group (up to SHOWN groups), with both outputs."""

    def size(item: Mismatch) -> int:
        return len(item[1].body or b"") + sum(len(v) for _, v in item[1].headers)

    groups: dict[tuple[str, tuple[str, ...]], list[Mismatch]] = {}
    for item in mismatches:
        _, request, lua, native = item
        lua_did, native_did = outcome(request, lua), outcome(request, native)
        if lua_did == native_did:  # the same outcome: what differs in it
            kind = (lua_did, _differs(lua, native))
        else:  # another outcome: the C's (Lua's varies with the body)
            kind = (f"Lua's outcome not the C's, {native_did}", ())
        groups.setdefault(kind, []).append(item)
    summary = [f"{len(mismatches)} of {REQUESTS} requests differ (seed {SEED}), in "
               f"{len(groups)} groups (outcome, what differs):"]  # fmt: skip
    summary += [f"  {len(items)} x {kind}" for kind, items in groups.items()]
    parts = ["\n".join(summary)]
    for kind, items in list(groups.items())[:SHOWN]:
        index, request, lua, native = min(items, key=size)
        parts.append(
            f"{kind}: request {index}:\n{request.show()}\nLua:\n{lua.show()}\nC:\n{native.show()}"
        )
    return "\n\n".join(parts)


def test_lua_and_native_readers_write_the_same(
    lua_reader: LuaReader, harness: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    requests = make_requests(SEED, REQUESTS)
    natives = replay(harness, requests)
    outcomes: Counter[str] = Counter()
    excused: Counter[str] = Counter()
    mismatches: list[Mismatch] = []
    for index, (request, native) in enumerate(zip(requests, natives, strict=True)):
        lua = lua_reader.read(request)
        outcomes[outcome(request, lua)] += 1
        if lua == native:
            continue
        why = documented(request, lua, native, lua_reader)
        if why is not None:
            excused[why] += 1
        else:
            mismatches.append((index, request, lua, native))
    with capsys.disabled():
        print(
            f"\n{lua_reader.runtime_name}: {REQUESTS} requests in "
            f"{time.monotonic() - started:.1f} s; outcomes {dict(sorted(outcomes.items()))}; "
            f"documented differences {dict(excused)}"
        )
    if mismatches:
        pytest.fail(_report(mismatches), pytrace=False)
    missing = [name for name in EXPECTED if outcomes[name] == 0]
    assert not missing, f"outcomes never reached: {missing} ({dict(outcomes)})"


def test_both_readers_remove_query_credentials_as_the_routing_stage_does(
    lua_reader: LuaReader, harness: Path
) -> None:
    """No provider sees a credential in the query string in either lane: the readers
    (which the exact lane's clients skip) send the path the routing stage's rule makes
    (filters/request_limits.py's without_query_credentials), byte for byte, and set no
    path when it has none."""
    exact = LANE_EXACT.encode() + b"/"
    requests = [rq for rq in make_requests(SEED, REQUESTS)
                if not (rq.header(CLIENT) or b"").startswith(exact)]  # fmt: skip
    natives = replay(harness, requests)
    removed = 0
    for request, native in zip(requests, natives, strict=True):
        path = request.header(PATH) or b""
        cleaned = without_query_credentials(path)
        expected = None if cleaned is None else (1, cleaned)
        assert lua_reader.read(request).headers.get(PATH) == expected, path
        assert native.headers.get(PATH) == expected, path
        removed += cleaned is not None
    assert removed > 100, removed  # the requests hold credentials often enough to tell


def test_the_stub_reads_as_envoy_does(lua_reader: LuaReader) -> None:
    """The stub itself: a repeated header joined, a splice's content-length, types kept."""
    body = b'{"model":"gpt-4o","stream":true}'
    request = Request(
        ((PATH, b"/v1/chat/completions"), (CLIENT, b"fast/acme/k1"), (SCENARIO, b"a"),
         (SCENARIO, b"")),
        body,
    )  # fmt: skip
    written = lua_reader.read(request)
    spliced = b"{" + wire.INCLUDE_USAGE_MEMBER.encode() + body[1:]
    assert written.error is None
    assert written.body == spliced
    assert written.headers[CONTENT_LENGTH] == (1, str(len(spliced)).encode())
    assert written.meta[wire.META_STREAM.encode()] == ("boolean", True, 1)
    assert written.meta[wire.META_SCENARIO_ASKED.encode()] == ("string", b"a,", 1)
    assert written.clears == 1
    raw = b'{"model":"m","prompt":"\xff\xc3"}'
    estimate = lua_reader.read(Request((), raw)).value(wire.META_ESTIMATE_INPUT)
    assert estimate == b"3"  # the quotes: 1; two bytes from 0xc0 up, each a character: 2
