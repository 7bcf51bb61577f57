"""The model reader: a request's `model` and `stream`, read by Envoy from the body
(routing without Python; docs/fast-lane.md).

A Lua filter walks the top level of the buffered body with plain searches (each string
skipped by looking for its closing quote, nested values by their brackets), so its cost
grows with the body's structure, not its text: Envoy's JSON filters parse every byte
into a document (about 40 ms a MB on Envoy's worker: a 100 KB prompt held the worker
1.6 ms in benchmarks/fast_lane_cost.py). It reads the members the routing stage reads
(filters/routing.py) by the same rules (filters/request_facts.py), and writes:

- into the `sluicegate` metadata namespace, `model` (a string) and `stream` (a boolean),
  where the routing stage writes them, or `body_problem` (local_replies.body_refusals'
  `problem`) for a body it refuses (the route that answers it is named after it, and the
  request record names its code from that: local_replies.answered_code);
- wire.USAGE_HEADER, who reads the answer's usage (filters/usage_reader.py's rule
  without reservations: a stream `stream`; a JSON answer of a text generation endpoint,
  without log probabilities and at most wire.LOG_MAX_OUTPUT_TOKENS allowed out, `log`; else
  `none`);

then clears the route cache, so the request re-matches on the metadata (routes.py).
Before all that it removes the credentials from the query string (wire.QUERY_CREDENTIALS)
by the routing stage's rule (filters/request_limits.py), so no provider sees them in
this lane either (an exact-lane client's request is left to the routing stage).

With tenants (docs/fast-lane.md, "Keys" and "Limits") it also reads the client Envoy's
key check named in wire.CLIENT_HEADER (the header stays for the routing stage's filter,
which skips a fast-lane client's; no provider gets it), writes the request's
tenant, key name and priority class (its own, or a lower one the client asks for in
wire.PRIORITY_HEADER; another is refused, `invalid_priority`), refuses a model the tenant
may not use (`model_not_allowed`), and, when a fast-lane tenant, key or route limits tokens, writes
the request's estimate: input tokens over the prompt members as filters/estimate.py
counts them, output tokens as the allowance, and their sum, which the token buckets
charge (tenant_limits.py).

It checks the top level's structure (brackets, strings, a top-level scalar's form), not
every value: a value it does not read is the provider's to judge, as is the text's
UTF-8. A body it could read differently from a provider's parser is refused as not
JSON: a top-level key with an escape or a non-ASCII byte (`"mod\\u0065l"`), or one that
is a member it reads in another case (`"Model"`: Go's encoding/json folds case). A
member it reads (wire.BODY_READ_MEMBERS) that occurs twice is refused, and so are an
output cap or `n` that is no whole number in range (the routing stage's rules,
filters/request_facts.py): the charge is read from them. A model name with an
escape other than `\\/` is matched as written, and no route serves it (model names hold
no backslash: config validation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from sluicegate import wire
from sluicegate.config import LANE_EXACT, LANE_FAST
from sluicegate.local_replies import (
    DUPLICATE_PREFIX,
    INVALID_PRIORITY,
    MAX_TOKENS_PREFIX,
    MODEL_NOT_ALLOWED,
    UNKNOWN_CLIENT,
)

MODEL_READER_FILTER: Final = "sluicegate.model_reader"
META_BODY_PROBLEM: Final = "body_problem"


@dataclass(frozen=True, slots=True)
class TenantFacts:
    """What the reader knows of one tenant: its priority class, the models it may use
    (None: every served model), and whether it is `auto` (its charged requests are marked
    wire.META_AUTO_LANE, for the lane log)."""

    priority: str
    models: frozenset[str] | None
    auto: bool = False


def _lua_string(value: str) -> str:
    # Names and models hold no quote, backslash or control character (config validation).
    return f'"{value}"'


def _lua_list(values: tuple[str, ...]) -> str:
    return "{" + ", ".join(_lua_string(value) for value in values) + "}"


def _lua_tenants(tenants: Mapping[str, TenantFacts]) -> str:
    rows = []
    for name in sorted(tenants):
        facts = tenants[name]
        models = (
            "nil"
            if facts.models is None
            else "{" + ", ".join(f"[{_lua_string(m)}] = true" for m in sorted(facts.models)) + "}"
        )
        auto = ", auto = true" if facts.auto else ""
        rows.append(
            f"  [{_lua_string(name)}] = {{name = {_lua_string(name)}, "
            f"priority = {_lua_string(facts.priority)}, models = {models}{auto}}},"
        )
    return "{\n" + "\n".join(rows) + "\n}" if rows else "{}"


@dataclass(frozen=True, slots=True)
class ReaderFacts:
    """What the model reader is configured with, whichever implements it (the Lua filter
    here, or the native one: native.py): `default_max_tokens` is the allowance of a
    request that names no output cap (admission.default_max_tokens), `max_output_tokens`
    the largest cap it may name (admission's); `tenants` those Envoy's key check may
    name; with `estimates`, each request's token estimate is written (a tenant or key
    limits tokens); for a stream of a model in `asks_usage` (every route serving it asks
    its providers for a stream's usage: model.Route.asks_stream_usage) whose client did
    not ask, the usage event is asked for the client, as the routing stage asks it; a
    tenant's request may ask for one of the priority `classes` (highest first) at or below
    its tenant's, as the routing stage lets it; an `auto` tenant's request for a model in
    `held` (model.Gateway.held_models) is passed to the routing stage, its client renamed
    into the exact lane; with `scenarios` (the config declares some), the scenario the
    client asked for is written as it came (wire.META_SCENARIO_ASKED), for the record to
    judge off the request's path (records.RecordDefaults)."""

    default_max_tokens: int
    max_output_tokens: int
    tenants: Mapping[str, TenantFacts] = field(default_factory=dict)
    estimates: bool = False
    asks_usage: frozenset[str] = frozenset()
    classes: tuple[str, ...] = ()
    held: frozenset[str] = frozenset()
    scenarios: bool = False


def model_reader_lua(facts: ReaderFacts) -> str:
    """The Lua filter's source."""
    default_max_tokens, tenants = facts.default_max_tokens, facts.tenants
    max_output_tokens, estimates, asks_usage = (
        facts.max_output_tokens, facts.estimates, facts.asks_usage
    )
    classes, held, scenarios = facts.classes, facts.held, facts.scenarios
    return rf"""
local NAMESPACE = "{wire.METADATA_NAMESPACE}"
local ENDPOINTS = {_lua_list(wire.GENERATION_ENDPOINTS)}
local CAPS = {_lua_list(wire.MAX_TOKENS_MEMBERS)}
local LOGPROBS = {_lua_list(wire.LOGPROBS_MEMBERS)}
local PROMPT = {{}}
for _, name in ipairs({_lua_list(wire.PROMPT_MEMBERS)}) do PROMPT[name] = true end
local TENANTS = {_lua_tenants(tenants or {})}
local ESTIMATES = {"true" if estimates else "false"}
local WANTED = {{}}
for _, name in ipairs({_lua_list(wire.BODY_READ_MEMBERS)}) do WANTED[name] = true end
local MAX_OUTPUT, MAX_N = {max_output_tokens}, {wire.MAX_N}
local ASKS_USAGE = {{}}
for _, name in ipairs({_lua_list(tuple(sorted(asks_usage)))}) do ASKS_USAGE[name] = true end
local USAGE_ENDPOINTS = {_lua_list(wire.STREAM_USAGE_ENDPOINTS)}
local RANK = {{}}
for rank, name in ipairs({_lua_list(classes)}) do RANK[name] = rank end
local HELD = {{}}
for _, name in ipairs({_lua_list(tuple(sorted(held)))}) do HELD[name] = true end
local SCENARIOS = {"true" if scenarios else "false"}
local CREDENTIALS = {{}}
for _, name in ipairs({_lua_list(tuple(sorted(wire.QUERY_CREDENTIALS)))}) do
  CREDENTIALS[name] = true
end
local find, sub, byte = string.find, string.sub, string.byte
local SPACE = {{[9] = true, [10] = true, [11] = true, [12] = true, [13] = true, [32] = true}}

-- `text` without its leading and trailing ASCII whitespace (Lua's %s) in one pass. A
-- client sends the text, and a pattern such as "^%s*(.-)%s*$" rescans the tail at every
-- length it tries: quadratic (about a second for a 16 KB header under LuaJIT 2.1,
-- measured outside Envoy).
local function trimmed(text)
  local first, last = 1, #text
  while first <= last and SPACE[byte(text, first)] do first = first + 1 end
  while last >= first and SPACE[byte(text, last)] do last = last - 1 end
  return sub(text, first, last)
end

-- A query parameter's name as the routing stage compares it with CREDENTIALS
-- (filters/request_limits.py's credential_name): the bytes before its first `=`, `+` a
-- space, each `%XX` its byte, ASCII whitespace trimmed, in lower case, `-` as `_`.
local function credential_name(part)
  local name = string.gsub(string.match(part, "^[^=]*"), "%+", " ")
  name = string.gsub(name, "%%(%x%x)", function(hex) return string.char(tonumber(hex, 16)) end)
  return (string.gsub(string.lower(trimmed(name)), "-", "_"))
end

-- The path without its CREDENTIALS parameters, the rest kept byte for byte
-- (filters/request_limits.py's without_query_credentials), or nil when it has none.
local function without_credentials(path)
  local mark = find(path, "?", 1, true)
  if mark == nil or mark == 1 then return nil end  -- every path Envoy passes starts with /
  local kept, removed = {{}}, false
  for part in string.gmatch(sub(path, mark + 1) .. "&", "([^&]*)&") do
    if CREDENTIALS[credential_name(part)] then removed = true else kept[#kept + 1] = part end
  end
  if not removed then return nil end
  if #kept == 0 then return sub(path, 1, mark - 1) end
  return sub(path, 1, mark) .. table.concat(kept, "&")
end

-- The index of the quote that closes the string opened at `i`, or nil.
local function string_end(text, i)
  local j = i
  while true do
    j = find(text, '"', j + 1, true)
    if j == nil then return nil end
    local k = j - 1
    while byte(text, k) == 92 do k = k - 1 end  -- backslashes before the quote
    if (j - 1 - k) % 2 == 0 then return j end
  end
end

-- The index of the last byte of the value that starts at `i`, or nil.
local function value_end(text, i)
  local c = byte(text, i)
  if c == 34 then return string_end(text, i) end
  if c == 123 or c == 91 then  -- an object or an array: its closers, innermost last
    local closers, j = {{}}, i
    while true do
      j = find(text, '[%[%]{{}}"]', j)
      if j == nil then return nil end
      c = byte(text, j)
      if c == 34 then
        j = string_end(text, j)
        if j == nil then return nil end
      elseif c == 123 then closers[#closers + 1] = 125
      elseif c == 91 then closers[#closers + 1] = 93
      else
        if closers[#closers] ~= c then return nil end
        closers[#closers] = nil
        if #closers == 0 then return j end
      end
      j = j + 1
    end
  end
  local stop = find(text, '[,}}%]%s]', i)
  if stop == i then return nil end
  return stop == nil and #text or stop - 1  -- a scalar may end the text
end

-- Whether `raw` is a JSON number: an integer part without leading zeros, then an
-- optional fraction and exponent.
local function is_number(raw)
  local rest = string.match(raw, "^%-?0(.*)$") or string.match(raw, "^%-?[1-9]%d*(.*)$")
  if rest == nil then return false end
  rest = string.match(rest, "^%.%d+(.*)$") or rest
  rest = string.match(rest, "^[eE][%+%-]?%d+(.*)$") or rest
  return rest == ""
end

-- A top level that is not an object: "object" when it is one whole JSON value, else "json".
local function not_object(text, i)
  local stop = value_end(text, i)
  if stop == nil or find(text, "[^ \t\r\n]", stop + 1) ~= nil then return "json" end
  local c, raw = byte(text, i), sub(text, i, stop)
  if c == 34 or c == 91 or raw == "true" or raw == "false" or raw == "null"
      or is_number(raw) then
    return "object"
  end
  return "json"
end

-- The top-level members in WANTED (raw text, but only `true` for a prompt member, whose
-- span goes to `spans`) and the first one repeated; or nil and a problem.
local function members(text, spans)
  local i = find(text, "[^ \t\r\n]")
  if i == nil then return nil, "json" end
  if byte(text, i) ~= 123 then return nil, not_object(text, i) end
  local found, repeated = {{}}, nil
  i = find(text, "[^ \t\r\n]", i + 1)
  if i ~= nil and byte(text, i) == 125 then
    if find(text, "[^ \t\r\n]", i + 1) ~= nil then return nil, "json" end
    return found, nil
  end
  while true do
    if i == nil or byte(text, i) ~= 34 then return nil, "json" end
    local e = string_end(text, i)
    if e == nil then return nil, "json" end
    local key = sub(text, i + 1, e - 1)
    -- Keys a provider's parser may read as one the reader reads (an escape, another
    -- case or a non-ASCII letter: Go's encoding/json folds case) are refused.
    if find(key, "[\\\128-\255]") ~= nil then return nil, "json" end
    if WANTED[string.lower(key)] and not WANTED[key] then return nil, "json" end
    i = find(text, "[^ \t\r\n]", e + 1)
    if i == nil or byte(text, i) ~= 58 then return nil, "json" end
    local start = find(text, "[^ \t\r\n]", i + 1)
    if start == nil then return nil, "json" end
    local stop = value_end(text, start)
    if stop == nil then return nil, "json" end
    if spans ~= nil and PROMPT[key] then
      spans[#spans + 1] = start
      spans[#spans + 1] = stop
    end
    if WANTED[key] then
      if found[key] ~= nil then
        repeated = repeated or key
      else
        found[key] = PROMPT[key] or sub(text, start, stop)
      end
    end
    i = find(text, "[^ \t\r\n]", stop + 1)
    if i == nil then return nil, "json" end
    local c = byte(text, i)
    if c == 125 then
      if find(text, "[^ \t\r\n]", i + 1) ~= nil then return nil, "json" end
      return found, repeated
    end
    if c ~= 44 then return nil, "json" end
    i = find(text, "[^ \t\r\n]", i + 1)
  end
end

-- A member's whole number from 1 to `most` (nil for one absent or null), or false.
local function counted(raw, most)
  if raw == nil or raw == "null" then return nil end
  if find(raw, "^[1-9]%d*$") == nil or #raw > 15 then return false end
  local value = tonumber(raw)
  return value <= most and value
end

-- What the client allows out, (its cap or the default) per choice; or nil and the
-- refusal of a cap or `n` out of range (every cap sent is checked, the first is used).
local function allowance(found)
  local cap = nil
  for _, name in ipairs(CAPS) do
    local value = counted(found[name], MAX_OUTPUT)
    if value == false then return nil, "{MAX_TOKENS_PREFIX}" .. name end
    if cap == nil then cap = value end
  end
  local n = counted(found.n, MAX_N)
  if n == false then return nil, "n" end
  return (cap or {default_max_tokens}) * (n or 1)
end

-- The input estimate over the prompt members' spans (filters/estimate.py): ASCII
-- characters / 4, rounded up once, plus one per other character (a UTF-8 lead byte).
-- One search tells whether the body holds any byte above 127 (the usual body holds none).
local function input_estimate(text, spans)
  local ascii, other = 0, 0
  local plain = find(text, "[\128-\255]") == nil
  for s = 1, #spans, 2 do
    local length = spans[s + 1] - spans[s] + 1
    if plain then
      ascii = ascii + length
    else
      local part = sub(text, spans[s], spans[s + 1])
      local _, high = string.gsub(part, "[\128-\255]", "")
      local _, leads = string.gsub(part, "[\192-\255]", "")
      ascii = ascii + length - high
      -- Bytes that start no character (not UTF-8, which a provider may still take)
      -- count as four to a token.
      other = other + math.max(leads, math.ceil(high / 4))
    end
  end
  return math.ceil(ascii / 4) + other
end

-- Whether the path (without its query and trailing slashes) ends with one of `suffixes`.
local function endpoint_in(path, suffixes)
  local endpoint = string.gsub(string.gsub(path or "", "%?.*$", ""), "/+$", "")
  for _, suffix in ipairs(suffixes) do
    if sub(endpoint, -#suffix) == suffix then return true end
  end
  return false
end

-- Who reads the answer's usage (filters/usage_reader.py, without reservations).
local function reader(path, found, stream, allowed)
  if stream then return "{wire.USAGE_BY_STREAM}" end
  if not endpoint_in(path, ENDPOINTS) then return "{wire.USAGE_UNREAD}" end
  for _, name in ipairs(LOGPROBS) do
    local raw = found[name]
    if raw ~= nil and raw ~= "false" and raw ~= "null" and raw ~= '""' and tonumber(raw) ~= 0
        and find(raw, "^%[%s*%]$") == nil and find(raw, "^{{%s*}}$") == nil then
      return "{wire.USAGE_UNREAD}"
    end
  end
  if allowed > {wire.LOG_MAX_OUTPUT_TOKENS} then return "{wire.USAGE_UNREAD}" end
  return "{wire.USAGE_BY_LOG}"
end

-- `class`: the request's priority class for its record (nil: none written), as the
-- routing stage writes it when it refuses (none before the class is known).
local function refuse(handle, problem, class)
  local meta = handle:streamInfo():dynamicMetadata()
  meta:set(NAMESPACE, "{META_BODY_PROBLEM}", problem)
  if class ~= nil then meta:set(NAMESPACE, "{wire.META_PRIORITY}", class) end
  handle:clearRouteCache()
end

-- The lane of the client Envoy's key check named (wire.CLIENT_HEADER:
-- "<lane>/<tenant>/<key name>") and, in the fast lane, its tenant's facts and key name,
-- written for the record and the limits. An exact-lane client's request is the routing
-- stage's, which comes next. The header stays for the routing stage's filter, which skips
-- a fast-lane client's (listeners.py); no provider gets it (routes.py).
local function client(handle, headers)
  local named = headers:get("{wire.CLIENT_HEADER}")
  if named == nil then return nil, nil, nil end
  local lane, tenant, key = string.match(named, "^([^/]+)/([^/]+)/([^/]+)$")
  if lane == "{LANE_EXACT}" then return lane, nil, nil end
  local facts = TENANTS[tenant]
  if lane ~= "{LANE_FAST}" or facts == nil then return "{UNKNOWN_CLIENT.problem}", nil, nil end
  local meta = handle:streamInfo():dynamicMetadata()
  meta:set(NAMESPACE, "{wire.META_TENANT}", tenant)
  meta:set(NAMESPACE, "{wire.META_KEY_NAME}", key)
  return lane, facts, key
end

-- The class a client asked for in wire.PRIORITY_HEADER if it is the tenant's or below
-- it, the tenant's when it asked none; nil for any other. Read as the routing stage reads
-- it (filters/admission/stream.py's requested_class): the last comma-separated value (Envoy
-- joins a repeated header's), trimmed of ASCII whitespace, in lower case.
local function priority(header, facts)
  if header == nil then return facts.priority end
  -- After the last comma, found from the end (a pattern would rescan: trimmed's why).
  local at = #header
  while at > 0 and byte(header, at) ~= 44 do at = at - 1 end
  local asked = string.lower(trimmed(sub(header, at + 1)))
  if asked == "" then return facts.priority end
  local rank = RANK[asked]
  if rank == nil or rank < RANK[facts.priority] then return nil end
  return asked
end

function envoy_on_request(handle)
  local headers = handle:headers()
  local lane, tenant, key = client(handle, headers)
  if lane == "{LANE_EXACT}" then return end  -- the routing stage decides it
  -- No provider sees a credential in the query string, as the routing stage removes them.
  local sent = without_credentials(headers:get(":path") or "")
  if sent ~= nil then headers:replace(":path", sent) end
  local asked = headers:get("{wire.PRIORITY_HEADER}")  -- the wrapper is void after body()
  local scenario = SCENARIOS and headers:get("{wire.SCENARIO_HEADER}") or nil
  if lane == "{UNKNOWN_CLIENT.problem}" then return refuse(handle, lane) end
  -- A tenant's refusal before its class is known is recorded without one.
  local none = tenant ~= nil and "{wire.NO_PRIORITY_CLASS}" or nil
  local body = handle:body()
  local size = body and body:length() or 0
  if size == 0 then
    -- A request without a body (a listing, a GET) is routed by its path, as the routing
    -- stage leaves it.
    if tenant ~= nil then
      handle:streamInfo():dynamicMetadata():set(NAMESPACE, "{wire.META_PRIORITY}", tenant.priority)
    end
    return
  end
  local text = body:getBytes(0, size)
  local spans = ESTIMATES and {{}} or nil
  local found, repeated = members(text, spans)
  if found == nil then return refuse(handle, repeated, none) end
  if repeated ~= nil then return refuse(handle, "{DUPLICATE_PREFIX}" .. repeated, none) end
  local model = found.model
  if model == nil or model == '""' then return refuse(handle, "model", none) end
  if byte(model, 1) ~= 34 then return refuse(handle, "model_type", none) end
  local stream = found.stream
  if stream ~= nil and stream ~= "true" and stream ~= "false" and stream ~= "null" then
    return refuse(handle, "stream", none)
  end
  stream = stream == "true"
  local allowed, problem = allowance(found)
  if allowed == nil then return refuse(handle, problem, none) end
  -- `\/` is `/` (PHP writes it); any other escape stays, and no model name holds one
  -- (validation), so no route serves it.
  model = string.gsub(sub(model, 2, -2), "\\/", "/")
  if tenant ~= nil and tenant.models ~= nil and not tenant.models[model] then
    return refuse(handle, "{MODEL_NOT_ALLOWED.problem}", tenant.priority)
  end
  if tenant ~= nil and tenant.auto and HELD[model] then
    -- What only the routing stage enforces applies (a gate, a provider's limits): it
    -- decides this request, as any exact-lane client's (it overwrites the metadata above).
    handle:headers():replace("{wire.CLIENT_HEADER}", "{LANE_EXACT}/" .. tenant.name .. "/" .. key)
    return
  end
  local meta = handle:streamInfo():dynamicMetadata()
  if tenant ~= nil then
    local class = priority(asked, tenant)
    if class == nil then return refuse(handle, "{INVALID_PRIORITY.problem}", none) end
    meta:set(NAMESPACE, "{wire.META_PRIORITY}", class)
  end
  meta:set(NAMESPACE, "{wire.META_MODEL}", model)
  meta:set(NAMESPACE, "{wire.META_STREAM}", stream)
  if scenario ~= nil then
    -- Cut: no declared name is longer (the record judges it).
    meta:set(NAMESPACE, "{wire.META_SCENARIO_ASKED}", sub(scenario, 1, {wire.MAX_SCENARIO_ASKED}))
  end

  if spans ~= nil then
    local input, output = input_estimate(text, spans), allowed
    meta:set(NAMESPACE, "{wire.META_ESTIMATE_INPUT}", string.format("%d", input))
    meta:set(NAMESPACE, "{wire.META_ESTIMATE_OUTPUT}", string.format("%d", output))
    meta:set(NAMESPACE, "{wire.META_ESTIMATE_TOKENS}", string.format("%d", input + output))
  end
  -- Last: the buckets charge a request only once all it is charged by is written.
  if tenant ~= nil then
    -- An auto tenant's charged request: its records are charged into the exact lane's
    -- windows and noted for the lane steering (sluicegate.lanes).
    if tenant.auto then meta:set(NAMESPACE, "{wire.META_AUTO_LANE}", true) end
    meta:set(NAMESPACE, "{wire.META_CHARGED_TENANT}", tenant.name)
  end
  -- Fetched again: a wrapper taken before body() is void once the body was awaited.
  headers = handle:headers()
  local path = headers:get(":path")
  -- A stream whose client did not ask for its usage (no `stream_options` at all): asked
  -- for it, spliced after the opening brace, and the event cut from the client's stream
  -- by the stream usage filter (filters/usage_reader.py's with_usage_asked).
  if stream and found.stream_options == nil and ASKS_USAGE[model]
      and endpoint_in(path, USAGE_ENDPOINTS) then
    local at = find(text, "{{", 1, true)
    text = sub(text, 1, at) .. '{wire.INCLUDE_USAGE_MEMBER}' .. sub(text, at + 1)
    body:setBytes(text)  -- which sets content-length to the new length
    meta:set(NAMESPACE, "{wire.META_USAGE_INJECTED}", "{wire.USAGE_INJECTED_TRUE}")
    headers:replace("{wire.USAGE_HEADER}", "{wire.USAGE_BY_STREAM_CHUNKS}")
  else
    headers:replace("{wire.USAGE_HEADER}", reader(path, found, stream, allowed))
  end
  handle:clearRouteCache()
end
"""
