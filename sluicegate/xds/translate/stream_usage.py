"""A stream's usage, read by Envoy: no Python sees any chunk (docs/admission.md,
"Reserve, then reconcile").

Two filters run on a response the routing stage marked wire.USAGE_BY_STREAM_CHUNKS, the
first alone on one marked wire.USAGE_BY_STREAM (filters/usage_reader.py chooses):

- `sse_to_metadata` reads the usage event of an event stream (`usage.prompt_tokens` …,
  or the Responses API's `response.usage`) into wire.USAGE_METADATA_NAMESPACE; the request
  record carries it to the ext_proc servers. The routing stage asks for that event
  (`stream_options.include_usage`) when the client did not, so every chat and completions
  stream has one.
- A Lua filter, on a stream with a reservation, counts the events that carry generated
  text into the same namespace (wire.USAGE_CONTENT_EVENTS, 0 from the stream's headers
  on): the charge of a stream that ends without a usage event (cut by the client or the
  provider, or a provider that may not be asked). On a stream whose usage event the
  client did not ask for (wire.META_USAGE_INJECTED), it cuts that event out, so the
  client receives the stream it asked for: only OpenAI's include_usage event, whose
  `choices` is empty (usage a provider also puts on a content event stays), and whole
  (until it is cut, an event split over chunks is held back until its end, which no
  client could read sooner). A stream that needs neither is marked for sse_to_metadata
  alone: a Lua filter costs Envoy even when it reads no chunk (benchmarks/RESULTS.md,
  "Streams at concurrency 1: the Lua filter only where needed"), and each chunk it reads
  about 20 µs ("Streams: usage read by Envoy, before and after"); one that needs only
  the cut is read until the cut.

sse_to_metadata must see the usage event before the Lua filter cuts it: response filters
run in the reverse of their order in the chain, so it is listed after the Lua filter.

The venv's protos (xds-protos 1.85) lack sse_to_metadata, so its config is a TypedStruct
of the message, which Envoy reads as if typed (as record_log.py does). Envoy 1.40 marks
the extension work-in-progress; it parses each `data:` event in C++ and holds no data.
"""

from __future__ import annotations

from typing import Final

from google.protobuf import any_pb2
from xds.type.v3 import typed_struct_pb2

from sluicegate import wire

from ._proto import lua, pack, struct

SSE_TO_METADATA_FILTER: Final = "envoy.filters.http.sse_to_metadata"
SSE_TO_METADATA_TYPE_URL: Final = (
    "type.googleapis.com/envoy.extensions.filters.http.sse_to_metadata.v3.SseToMetadata"
)
JSON_CONTENT_PARSER: Final = "envoy.content_parsers.json"
JSON_CONTENT_PARSER_TYPE_URL: Final = (
    "type.googleapis.com/envoy.extensions.content_parsers.json.v3.JsonContentParser"
)
LUA_FILTER: Final = "envoy.filters.http.lua"

# (selector path, metadata key): chat and completions put usage at the top of their last
# event; the Responses API inside `response` of its final `response.completed` event.
_USAGE_PATHS: Final = (
    *((("usage", member), member) for member in wire.USAGE_MEMBERS),
    (("response", "usage", "input_tokens"), "input_tokens"),
    (("response", "usage", "output_tokens"), "output_tokens"),
)

# Events that carry generated text, as filters/usage.py counts them: a non-empty string in
# `content`, `reasoning_content`, `reasoning`, `refusal`, a tool call's `arguments`, a
# legacy completion's `text`, or a Responses API `*.delta` event's `delta` (its `*.done`
# events and `response.completed` repeat the text, so they do not count). A key inside a
# string is escaped (\"content\"), so it never matches. Without a cut to make, an event
# split across two chunks may be counted twice or not at all: the count is a reserved
# stream's, for its charge (and its output in the metrics) when no usage comes; the
# native usage reader counts every stream, each line once (docs/native-filters.md).
STREAM_USAGE_LUA: Final = rf"""
local NAMESPACE = "{wire.USAGE_METADATA_NAMESPACE}"
local COUNT_KEY = "{wire.USAGE_CONTENT_EVENTS}"
local KEYS = {{'"content":', '"reasoning_content":', '"reasoning":', '"refusal":',
              '"arguments":', '"text":', '"delta":'}}

-- Whether some `key` (with its colon) in `line` is followed by a non-empty string. Plain
-- searches: a pattern is tried at every byte of the line, a plain search is memchr's.
local function has_string(line, key)
  local init = 1
  while true do
    local _, stop = string.find(line, key, init, true)
    if stop == nil then return false end
    local first = string.match(line, '^%s*"(.)', stop + 1)
    if first ~= nil and first ~= '"' then return true end
    init = stop + 1
  end
end

local function has_text(line)
  if string.find(line, '"response.', 1, true) ~= nil then
    local _, kind = string.find(line, '"type":%s*"response%.')
    if kind ~= nil then
      -- The Responses API: only a `*.delta` event is new text; its `*.done` events and
      -- `response.completed` repeat what the deltas carried.
      local close = string.find(line, '"', kind + 1, true)
      if close == nil or string.sub(line, close - 6, close - 1) ~= ".delta" then
        return false
      end
      return has_string(line, '"delta":')
    end
  end
  for _, key in ipairs(KEYS) do
    if has_string(line, key) then return true end
  end
  return false
end

-- Events of `text` that carry generated text (each `data:` line counted once).
local function text_events(text)
  local found = 0
  for line in string.gmatch(text, "data:[^\n]*") do
    if has_text(line) then found = found + 1 end
  end
  return found
end

-- The end of the last blank line in `text` (0: none); after it, an event not yet whole.
local function last_boundary(text)
  -- Most chunks end an event: no search.
  if string.sub(text, -2) == "\n\n" or string.sub(text, -3) == "\n\r\n" then return #text end
  local last, init = 0, 1
  while true do
    local _, stop = string.find(text, "\n\r?\n", init)
    if stop == nil then return last end
    last, init = stop, stop + 1
  end
end

-- Whole `events` without the usage event the gateway asked for: OpenAI's include_usage
-- event, whose `choices` is empty (usage a provider puts on a content event, or under
-- another key, stays: that event is the client's). The text kept, and whether it cut.
local function without_usage_event(events)
  local pieces, cut, init = {{}}, false, 1
  while init <= #events do
    local _, stop = string.find(events, "\n\r?\n", init)
    if stop == nil then stop = #events end
    local event = string.sub(events, init, stop)
    if not cut and string.find(event, '"usage":%s*{{') ~= nil
        and string.find(event, '"choices":%s*%[%s*%]') ~= nil then
      cut = true
    else
      pieces[#pieces + 1] = event
    end
    init = stop + 1
  end
  return table.concat(pieces), cut
end

function envoy_on_response(handle)
  local media = handle:headers():get("content-type")
  if media == nil or string.find(string.lower(media), "text/event-stream", 1, true) == nil then
    return
  end
  local facts = handle:streamInfo():dynamicMetadata():get("{wire.METADATA_NAMESPACE}")
  if facts == nil then return end
  local cut = facts["{wire.META_USAGE_INJECTED}"] == "{wire.USAGE_INJECTED_TRUE}"
  -- Only a reservation needs the count: a stream cut before its usage event is charged
  -- by it (0 until a text event comes). Without one, and nothing to cut, no chunk is read.
  local counts = facts["{wire.META_RESERVATION}"] ~= nil
  if not cut and not counts then return end
  -- A cut makes the body shorter than a provider's content-length (a stream sent whole,
  -- by a buffering proxy say): without it the answer goes chunked.
  if cut then handle:headers():remove("content-length") end
  if counts then handle:streamInfo():dynamicMetadata():set(NAMESPACE, COUNT_KEY, 0) end
  local count = 0
  local carry = ""  -- while the cut is armed: the start of an event not yet whole
  for chunk in handle:bodyChunks() do
    local size = chunk:length()
    local text = size > 0 and chunk:getBytes(0, size) or ""
    local before = count
    if cut then
      local held = carry ~= ""
      text = carry .. text
      -- Whole events only, so the usage event is never half sent when it comes: the
      -- rest waits for its end (a client cannot read half an event anyway), except a
      -- last `data: [DONE]` without its blank line.
      local whole = last_boundary(text)
      carry = string.sub(text, whole + 1)
      if string.find(carry, "^data: %[DONE%]") ~= nil then carry, whole = "", #text end
      local events, changed = string.sub(text, 1, whole), held or carry ~= ""
      if counts then count = count + text_events(events) end
      if string.find(events, '"usage":', 1, true) ~= nil
          and string.find(events, '"usage":%s*{{') ~= nil then
        local kept, done = without_usage_event(events)
        if done then
          events, changed, cut = kept .. carry, true, false
          carry = ""
        end
      end
      if changed then chunk:setBytes(events) end
    elseif counts then
      count = count + text_events(text)
    end
    if count ~= before then
      -- Envoy's wrappers do not outlive a yield: fetched again after each chunk.
      handle:streamInfo():dynamicMetadata():set(NAMESPACE, COUNT_KEY, count)
    end
    if not cut and not counts then return end  -- the rest passes untouched
  end
end
"""


def sse_to_metadata_config() -> any_pb2.Any:
    """The usage members of a stream's events into wire.USAGE_METADATA_NAMESPACE, kept as
    JSON numbers; a later event's value replaces an earlier one's. Events without usage
    (and `"usage": null`) write nothing, and no rule has an on_missing or on_error value:
    `data: [DONE]` is not JSON, and would count as an error on every stream."""
    rules = [
        {
            "rule": {
                "selectors": [{"key": key} for key in path],
                "on_present": {"metadata_namespace": wire.USAGE_METADATA_NAMESPACE, "key": name},
            }
        }
        for path, name in _USAGE_PATHS
    ]
    parser = {"@type": JSON_CONTENT_PARSER_TYPE_URL, "rules": rules}
    config = {
        "response_rules": {"content_parser": {"name": JSON_CONTENT_PARSER, "typed_config": parser}}
    }
    typed = typed_struct_pb2.TypedStruct(type_url=SSE_TO_METADATA_TYPE_URL, value=struct(config))
    return pack(typed)


def stream_usage_lua_config() -> any_pb2.Any:
    """The Lua filter that counts content events and cuts an injected usage event."""
    return pack(
        lua(STREAM_USAGE_LUA)
    )
