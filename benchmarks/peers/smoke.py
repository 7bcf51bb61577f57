"""Smoke run of the comparison's peers: install what is missing, start each peer in turn
against one mock provider, send one chat completion and one streamed one through it,
check both, and stop it.

    python -m benchmarks.peers.smoke [--only NAME ...] [--envoy-concurrency N] [--keep]

Printed per peer: what runs (versions), the install time (about 0 when cached), the start
time (until it serves and its process tree is idle), the idle RSS of its tree (the sum of
VmRSS over `pids()`: pages shared between processes count once per process), and the
checks: a JSON answer (200, `choices`, the mock's token count in `usage`) and a stream
(200, as many content chunks as the mock's tokens, ending in `data: [DONE]`). At the end:
no process of any peer may be left, and no per-run key may be in any file the peers
wrote. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from benchmarks.harness.stack import MockProvider
from sluicegate.testing import alive, free_ports

from .catalog import peers
from .peer import CACHE, UPSTREAM_KEY, Peer, RunningPeer, Upstream
from .processes import rss_bytes

MODEL: Final = "bench-model"
TOKENS: Final = 8  # the mock's answer: this many tokens, each its own stream chunk
MIB: Final = 1024 * 1024
TIMEOUT: Final = aiohttp.ClientTimeout(total=30)


class CheckFailed(Exception):
    pass


@dataclass
class Outcome:
    name: str
    does: str = "?"
    version: str = "?"
    install_s: float | None = None
    start_s: float | None = None
    idle_rss: int | None = None
    processes: int = 0
    checks: list[str] = field(default_factory=list)
    ok: bool = False


def _body(model: str, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 64,
        "stream": stream,
    }


async def check_json(session: aiohttp.ClientSession, peer: RunningPeer) -> str:
    url = peer.url + "/v1/chat/completions"
    async with session.post(url, json=_body(peer.model, False), headers=peer.headers) as answer:
        text = await answer.text()
        if answer.status != 200:
            raise CheckFailed(f"JSON: HTTP {answer.status}: {text[:200]}")
    document = json.loads(text)
    choices = document.get("choices")
    if not isinstance(choices, list) or not choices:
        raise CheckFailed(f"JSON: no choices: {text[:200]}")
    tokens = (document.get("usage") or {}).get("completion_tokens")
    if tokens != TOKENS:
        raise CheckFailed(f"JSON: usage.completion_tokens {tokens}, the mock sent {TOKENS}")
    return f"JSON ok (200, {len(choices)} choice, {tokens} tokens)"


async def check_stream(session: aiohttp.ClientSession, peer: RunningPeer) -> str:
    url = peer.url + "/v1/chat/completions"
    async with session.post(url, json=_body(peer.model, True), headers=peer.headers) as answer:
        if answer.status != 200:
            raise CheckFailed(f"stream: HTTP {answer.status}: {(await answer.text())[:200]}")
        events = [
            line.decode().removeprefix("data:").strip()
            async for line in answer.content
            if line.startswith(b"data:")
        ]
    if not events or events[-1] != "[DONE]":
        raise CheckFailed(f"stream: does not end in data: [DONE] ({events[-1:]})")
    content = 0
    for event in events[:-1]:
        for choice in json.loads(event).get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                content += 1
    if content != TOKENS:
        raise CheckFailed(f"stream: {content} content chunks, the mock sent {TOKENS}")
    return f"stream ok (200, {content} content chunks in {len(events) - 1} events, [DONE])"


async def probe(peer: RunningPeer) -> list[str]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        return [await check_json(session, peer), await check_stream(session, peer)]


def smoke(peer: Peer, upstream: Upstream, seen: set[int], secrets: set[str]) -> Outcome:
    outcome = Outcome(peer.name, peer.does)
    started = time.monotonic()
    peer.install()
    outcome.install_s = time.monotonic() - started
    outcome.version = peer.version()
    started = time.monotonic()
    running = peer.start(upstream)
    outcome.start_s = time.monotonic() - started
    try:
        secrets.update(
            value.removeprefix("Bearer ")
            for value in running.headers.values()
            if value.startswith("Bearer ") and value != f"Bearer {UPSTREAM_KEY}"
        )
        pids = running.pids()
        seen.update(pids)
        outcome.processes = len(pids)
        outcome.idle_rss = rss_bytes(pids) if pids else None
        outcome.checks = asyncio.run(probe(running))
        seen.update(running.pids())
        outcome.ok = True
    except CheckFailed as failed:
        outcome.checks.append(f"FAILED {failed}")
    finally:
        running.stop()
    return outcome


def leftovers(seen: set[int], work: Path) -> list[str]:
    """Processes of the peers still running: pids seen during the run, and any whose
    command line names the install cache or the work directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if int(entry.name) in seen or str(CACHE) in command or str(work) in command:
            found.append(f"{entry.name} {command}")
    return found


def secrets_written(work: Path, secrets: set[str]) -> list[str]:
    """Files under `work` holding one of the per-run keys."""
    found = []
    for path in work.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            found += [str(path) for secret in secrets if secret in text]
    return found


def _pgrep(pattern: str) -> str:
    """`pgrep -af pattern` without this run's own processes (its command line says
    `litellm` when it names the peers)."""
    result = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
    own = {str(os.getpid()), str(os.getppid())}
    lines = [line for line in result.stdout.splitlines() if line.split(" ", 1)[0] not in own]
    return "; ".join(lines) or "(none)"


def report(outcome: Outcome) -> str:
    rss = "—" if outcome.idle_rss is None else f"{outcome.idle_rss / MIB:.1f} MiB"
    timing = (
        f"install {outcome.install_s or 0:.1f} s, start {outcome.start_s or 0:.1f} s, "
        f"idle RSS {rss} over {outcome.processes} process(es)"
    )
    return "\n".join(
        [
            f"== {outcome.name}: {outcome.version}",
            f"   per request: {outcome.does}",
            f"   {timing}",
            f"   {'; '.join(outcome.checks)}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these peers only")
    parser.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy workers")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-peers-smoke-"))
    catalog = peers(work, envoy_concurrency=args.envoy_concurrency)
    names = args.only or list(catalog)
    if unknown := set(names) - set(catalog):
        parser.error(f"unknown peers {sorted(unknown)}; known: {', '.join(catalog)}")
    (port,) = free_ports(1)
    knobs = ["--ttft-ms", "0", "--itl-ms", "0", "--output-tokens", str(TOKENS)]
    mock = MockProvider("upstream", port, work, knobs)
    outcomes: list[Outcome] = []
    seen: set[int] = set()
    secrets: set[str] = set()
    try:
        mock.wait_ready()
        upstream = Upstream(mock.base, MODEL)
        print(f"upstream: sluicegate mock-provider on {upstream.url} ({TOKENS} tokens at once); "
              f"work: {work}", flush=True)  # fmt: skip
        for name in names:
            try:
                outcome = smoke(catalog[name], upstream, seen, secrets)
            except Exception:
                failure = "FAILED " + traceback.format_exc(limit=3)
                outcome = Outcome(name, catalog[name].does, checks=[failure])
            outcomes.append(outcome)
            print(report(outcome), flush=True)
    finally:
        mock.stop()
    left = leftovers(seen, work)
    written = secrets_written(work, secrets)
    print(f"left running: {left or 'none'}")
    print(f"pgrep -af litellm: {_pgrep('litellm')}")
    print(f"pgrep -af node: {_pgrep('node')}")
    print(f"per-run keys found in files under the work directory: {written or 'none'}")
    failed = [o.name for o in outcomes if not o.ok]
    print(f"{len(outcomes) - len(failed)}/{len(outcomes)} peers passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))  # fmt: skip
    if args.keep or failed:
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed or left or written else 0


if __name__ == "__main__":
    raise SystemExit(main())
