"""Lua run inside Redis: one script per decision, so a decision is atomic.

Layout (every key carries the same hash tag, so all of them live in one Cluster
slot and one script may touch them all):
  sg:{prefix}:l:<limit key>  ZSET, the sliding-window log: member "<amount>:<rid>",
                             score = decision time in µs (Redis TIME)
  sg:{prefix}:t:<limit key>  STRING, running total of the log's amounts
  sg:{prefix}:r:<rid>        HASH, the reservation or charge: t (µs),
                             e (JSON list of [limit key, kind, window ms, estimate]),
                             d (reconciled)

The clock is Redis `TIME`, never a client's: replicas with skewed clocks must
still agree on which charges are inside a window. Times stay exact because µs
since the epoch fit in a double (< 2^53) and numbers passed to redis.call are
formatted exactly; only Lua's tostring/.. would round, so they are never applied
to times.

The charge script (a request admitted elsewhere, counted unchecked) writes log entries,
totals and the record as reserve does.

The reconcile script is given only the record key; it reads the limit keys from
the record. They share the record's slot, so this is safe on Cluster too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from .decision import RETRY_WALK_CAP


@dataclass(frozen=True, slots=True)
class Script:
    """Lua source with its SHA1, the name EVALSHA calls it by."""

    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> Script:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


# Shared helpers: the time, a member's amount, the total as the log stands, and the
# total once the charges that left the window are dropped.
_COMMON: Final = r"""
if redis.replicate_commands then redis.replicate_commands() end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local function amount_of(member)
  return tonumber(string.match(member, '^(%d+):'))
end

-- The running total; rebuilt from the log if the total key was lost (eviction).
local function read_total(log, total_key)
  local raw = redis.call('GET', total_key)
  if raw then return tonumber(raw) end
  local sum = 0
  for _, member in ipairs(redis.call('ZRANGE', log, 0, -1)) do
    sum = sum + amount_of(member)
  end
  return sum
end

-- Rule "exact sliding window": a charge at t counts while now < t + window.
-- Drops the charges that left and answers the total of those that remain.
local function pruned_total(log, total_key, window)
  if redis.call('EXISTS', log) == 0 then return 0 end  -- a total without a log is stale
  local total = read_total(log, total_key)
  local cutoff = now - window
  local gone = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  if #gone == 0 then return total end
  for _, member in ipairs(gone) do total = total - amount_of(member) end
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  if redis.call('EXISTS', log) == 0 then
    redis.call('DEL', total_key)
    return 0
  end
  redis.call('SET', total_key, total, 'KEEPTTL')
  if redis.call('PTTL', total_key) < 0 then
    redis.call('PEXPIRE', total_key, window / 1000)  -- it had been lost and rebuilt
  end
  return total
end
"""

RESERVE_SOURCE: Final = (
    _COMMON
    + r"""
-- KEYS: log_1, total_1, ..., log_n, total_n, record
-- ARGV: rid, record JSON, then per limit: amount, limit, window ms
local rid = ARGV[1]
local n = (#KEYS - 1) / 2
local record = KEYS[#KEYS]
if redis.call('EXISTS', record) == 1 then return {-1} end


local logs, totals, amounts, limits, windows, used = {}, {}, {}, {}, {}, {}
for i = 1, n do
  logs[i], totals[i] = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 3 + (i - 1) * 3
  amounts[i] = tonumber(ARGV[a])
  limits[i] = tonumber(ARGV[a + 1])
  windows[i] = tonumber(ARGV[a + 2]) * 1000
  used[i] = pruned_total(logs[i], totals[i], windows[i])
end

-- Rule "too large first": a request that can never fit is told so, not retried.
local status, refused, retry = 1, 0, -1
for i = 1, n do
  if amounts[i] > limits[i] then
    status, refused = 2, i
    break
  end
end
if status == 1 then
  for i = 1, n do
    if used[i] + amounts[i] > limits[i] then
      status, refused = 0, i
      break
    end
  end
end

if status == 0 then
  -- Rule "earliest fit", with a bounded walk (then one whole window).
  local need = used[refused] + amounts[refused] - limits[refused]
  local oldest = redis.call('ZRANGE', logs[refused], 0, WALK_CAP - 1, 'WITHSCORES')
  local freed = 0
  retry = windows[refused]
  for k = 1, #oldest, 2 do
    freed = freed + amount_of(oldest[k])
    if freed >= need then
      retry = tonumber(oldest[k + 1]) + windows[refused] - now
      break
    end
  end
elseif status == 1 then
  -- Rule "all or nothing": charges are written only once every limit agreed.
  local longest = 0
  for i = 1, n do
    if amounts[i] > 0 then
      local ttl_ms = windows[i] / 1000
      redis.call('ZADD', logs[i], now, string.format('%d:%s', amounts[i], rid))
      redis.call('PEXPIRE', logs[i], ttl_ms)
      used[i] = used[i] + amounts[i]
      redis.call('SET', totals[i], used[i], 'PX', ttl_ms)
    end
    if windows[i] > longest then longest = windows[i] end
  end
  redis.call('HSET', record, 't', now, 'e', ARGV[2])
  redis.call('PEXPIRE', record, longest / 1000)
end

-- Reply: status (1 admitted, 0 refused, 2 too large, -1 id in use), index of the
-- refusing limit (1-based, 0 none), retry µs (-1 none), then per limit: used, reset µs.
local reply = {status, refused, retry}
for i = 1, n do
  local reset = 0
  local newest = redis.call('ZRANGE', logs[i], -1, -1, 'WITHSCORES')
  if #newest > 0 then reset = tonumber(newest[2]) + windows[i] - now end
  reply[#reply + 1] = used[i]
  reply[#reply + 1] = reset
end
return reply
""".replace("WALK_CAP", str(RETRY_WALK_CAP))
)

RECONCILE_SOURCE: Final = (
    _COMMON
    + r"""
-- KEYS: record.  ARGV: rid, key base ("sg:{prefix}:"), input tokens, output tokens,
-- requests (1, or 0 for a request the gateway itself turned away)
local record = KEYS[1]
local rid, base = ARGV[1], ARGV[2]
local input, output = tonumber(ARGV[3]), tonumber(ARGV[4])
local requests = tonumber(ARGV[5] or '1')
local fields = redis.call('HMGET', record, 't', 'e', 'd')
if not fields[1] or fields[3] then return 0 end  -- unknown, expired or done

local function amount(kind)
  if kind == 'requests' then return requests end
  if kind == 'input_tokens' then return input end
  if kind == 'output_tokens' then return output end
  return input + output
end

-- Keep a key alive at least until this charge leaves its window.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

local t = tonumber(fields[1])
for _, charge in ipairs(cjson.decode(fields[2])) do
  local key, kind, window, estimate = charge[1], charge[2], charge[3] * 1000, charge[4]
  local actual = amount(kind)
  -- Rule "reconcile in place": only charges still in their window change; the
  -- charge keeps its decision time, only its amount becomes the real one.
  if actual ~= estimate and t + window > now then
    local log, total_key = base .. 'l:' .. key, base .. 't:' .. key
    local present = estimate == 0
      or redis.call('ZREM', log, string.format('%d:%s', estimate, rid)) == 1
    if present then
      local existed = redis.call('EXISTS', log) == 1
      if actual > 0 then
        redis.call('ZADD', log, t, string.format('%d:%s', actual, rid))
      end
      local total
      local raw = redis.call('GET', total_key)
      if not existed then
        total = actual  -- a total without a log is stale
      elseif raw then
        total = tonumber(raw) + actual - estimate
      else
        total = read_total(log, total_key)  -- lost: rebuilt from the log as it is now
      end
      redis.call('SET', total_key, total, 'KEEPTTL')
      local ms = math.ceil((t + window - now) / 1000)
      keep(total_key, ms)
      if actual > 0 then keep(log, ms) end
    end
  end
end
redis.call('HSET', record, 'd', 1)
return 1
"""
)

CHARGE_SOURCE: Final = (
    _COMMON
    + r"""
-- KEYS: log_1, total_1, ..., log_n, total_n, record.
-- ARGV: id, record JSON, then per limit: amount, window ms
-- A request admitted elsewhere (an auto tenant's fast-lane one): charged now on every
-- limit whatever it holds, with a record written as reserve writes it, so reconcile
-- replaces the charge later.
-- Reply: 1, or -1 (nothing written) when the id is in use: its record lives (it outlives
-- the id's log entries, and is there even when every charge is 0).
local rid = ARGV[1]
local n = (#KEYS - 1) / 2
local record = KEYS[#KEYS]
if redis.call('EXISTS', record) == 1 then return -1 end
local longest = 0
for i = 1, n do
  local log, total_key = KEYS[2 * i - 1], KEYS[2 * i]
  local amount = tonumber(ARGV[1 + 2 * i])
  local window = tonumber(ARGV[2 + 2 * i]) * 1000
  if amount > 0 then
    local used = pruned_total(log, total_key, window) + amount
    local ttl_ms = window / 1000
    redis.call('ZADD', log, now, string.format('%d:%s', amount, rid))
    redis.call('PEXPIRE', log, ttl_ms)
    redis.call('SET', total_key, used, 'PX', ttl_ms)
  end
  if window > longest then longest = window end
end
redis.call('HSET', record, 't', now, 'e', ARGV[2])
redis.call('PEXPIRE', record, longest / 1000)
return 1
"""
)

RESERVE: Final = Script.of(RESERVE_SOURCE)
RECONCILE: Final = Script.of(RECONCILE_SOURCE)
CHARGE: Final = Script.of(CHARGE_SOURCE)
