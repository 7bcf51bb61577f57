"""wrk sending a fixed number of requests cycled from a list of shapes.

One wrk thread cycles through the shapes in order; `{n}` in a body or a header value
becomes the request's own number, so no two bodies are alike (a cache keyed by what a
client sends would show as growth). The thread stops after the budget's responses; requests other
connections still had in flight are cut then, so every run also ends a few streams
early, as clients who leave do. Needs `wrk` (Debian: `apt-get install wrk`).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Lua's long brackets hold any text but their own closing bracket.
_CLOSE = "]==]"


@dataclass(frozen=True)
class Shape:
    """One request of the cycle: path, headers and body (`{n}`: the request's number)."""

    path: str
    headers: Mapping[str, str]
    body: str


@dataclass(frozen=True)
class WrkRun:
    requests: int
    by_status: Mapping[int, int]
    socket_errors: int
    seconds: float


def _lua_text(text: str) -> str:
    if _CLOSE in text:
        raise ValueError("a shape holds ]==], which the Lua script cannot quote")
    return f"[==[{text}]==]"


def cycle_script(shapes: Sequence[Shape]) -> str:
    """The Lua script: `wrk ... -- BUDGET FIRST` sends BUDGET requests, numbered from FIRST."""
    entries = []
    for shape in shapes:
        headers = ", ".join(
            f"[ {_lua_text(k)} ] = {_lua_text(v)}" for k, v in sorted(shape.headers.items())
        )
        entries.append(
            f"{{path = {_lua_text(shape.path)}, headers = {{{headers}}}, "
            f"body = {_lua_text(shape.body)}}}"
        )
    return (
        "local shapes = {\n  "
        + ",\n  ".join(entries)
        + "\n}\n"
        + """
local budget, n, answered = 0, 0, 0
counts = {}
local threads = {}

function setup(thread) table.insert(threads, thread) end

function init(args)
  budget = tonumber(args[1])
  n = tonumber(args[2] or "0")
end

function request()
  n = n + 1
  local shape = shapes[(n % #shapes) + 1]
  local number = tostring(n)
  local headers = {}
  for name, value in pairs(shape.headers) do
    headers[name] = string.gsub(value, "{n}", number)
  end
  local body = string.gsub(shape.body, "{n}", number)
  return wrk.format("POST", shape.path, headers, body)
end

function response(status, headers, body)
  answered = answered + 1
  counts[status] = (counts[status] or 0) + 1
  if answered == budget then
    -- wrk's main thread sleeps out -d whatever its threads do: tell the caller, who
    -- interrupts it (SIGINT: wrk then reports as at the end of -d).
    io.write("BUDGET_DONE\\n")
    io.stdout:flush()
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format("SOCKET_ERRORS %d\\n",
    errors.connect + errors.read + errors.write + errors.timeout))
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("counts")) do
      io.write(string.format("STATUS %d %d\\n", status, count))
    end
  end
end
"""
    )


def write_cycle_script(path: Path, shapes: Sequence[Shape]) -> Path:
    path.write_text(cycle_script(shapes))
    return path


def run_cycle(
    url: str, script: Path, budget: int, *, first: int = 0, connections: int = 8,
    max_seconds: float = 3600.0,
) -> WrkRun:  # fmt: skip
    """`budget` requests through one wrk thread on `connections` connections."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{max_seconds:g}s", "--timeout", "30s",
            "-s", str(script), url, "--", str(budget), str(first)]  # fmt: skip
    started = time.monotonic()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as wrk:
        assert wrk.stdout is not None
        for line in wrk.stdout:
            if line.startswith("BUDGET_DONE"):
                wrk.send_signal(signal.SIGINT)
                break
        stdout, stderr = wrk.communicate(timeout=60)
    if wrk.returncode != 0:
        raise RuntimeError(f"wrk failed ({wrk.returncode}):\n{stdout}\n{stderr}")
    seconds = time.monotonic() - started
    by_status = {
        int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^STATUS (\d+) (\d+)$", stdout, re.M)
    }
    errors = re.search(r"^SOCKET_ERRORS (\d+)$", stdout, re.M)
    if errors is None or not by_status:
        raise RuntimeError(f"wrk printed no result:\n{stdout}\n{stderr}")
    return WrkRun(sum(by_status.values()), by_status, int(errors.group(1)), seconds)


def json_body(document: Mapping[str, object]) -> str:
    """A compact JSON body (the `{n}` placeholder survives json.dumps unchanged)."""
    return json.dumps(document, separators=(",", ":"))
