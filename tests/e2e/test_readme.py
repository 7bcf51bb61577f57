"""The README's quickstart, run as written: its OpenAI SDK snippet and its curl tour.

The commands are taken from README.md's fenced code blocks under "## The quickstart"
and run against `sluicegate up` on the quickstart's own addresses (the ones the README
names), so an edit to either the README or the stack that breaks a documented command
fails here. Each tour block is matched to what the README says it gives; a block the
test does not know fails too, so the tour cannot grow unchecked.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluicegate.testing import EXAMPLES
from tests.e2e.stack import Stack, holding_quickstart_addresses, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## The quickstart"
# The quickstart's own addresses: gateway, Envoy admin, xDS, ext_proc, status, two mocks.
PORTS = (10000, 9901, 18000, 18001, 9100, 18081, 18082)
# `sluicegate` (for readers who paste more) and this interpreter first on PATH.
VENV_BIN = str(Path(sys.executable).parent)


def fenced_blocks(text: str, heading: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block in the `## ` section starting at heading."""
    blocks: list[tuple[str, str]] = []
    inside_section = False
    language: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if language is None and line.startswith("## "):
            inside_section = line.strip() == heading
        if not inside_section:
            continue
        if line.startswith("```"):
            if language is None:
                language = line[3:].strip()
                body = []
            else:
                blocks.append((language, "\n".join(body) + "\n"))
                language = None
        elif language is not None:
            body.append(line)
    return blocks


def quickstart_blocks(language: str) -> list[str]:
    found = [body for lang, body in fenced_blocks(README.read_text(), SECTION) if lang == language]
    assert found, f"README.md has no {language} block under {SECTION!r}"
    return found


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        # REUSEADDR: connections in TIME_WAIT do not make a port busy for a server.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@pytest.fixture
def quickstart(tmp_path: Path) -> Iterator[Stack]:
    """`sluicegate up` on examples/quickstart.yaml unchanged (its key files beside it)."""
    with holding_quickstart_addresses():
        yield from _quickstart(tmp_path)


def _quickstart(tmp_path: Path) -> Iterator[Stack]:
    deadline = time.monotonic() + 30  # another e2e test may hold them for a moment
    while any(_port_taken(port) for port in PORTS):
        if time.monotonic() > deadline:
            pytest.skip("a quickstart port stays taken on this machine")
        time.sleep(0.5)
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    shutil.copytree(EXAMPLES / "keys", tmp_path / "keys")
    with running_stack(tmp_path, doc) as stack:
        assert stack.gateway == "http://127.0.0.1:10000"
        yield stack


def run(argv: list[str], timeout_s: float = 60) -> str:
    env = {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    assert result.returncode == 0, f"{argv[:2]} exited {result.returncode}:\n{result.stderr}"
    return result.stdout


def error_of(output: str) -> dict[str, Any]:
    """The OpenAI error object after the headers of `curl -si` output (newlines
    translated: `run` reads text)."""
    error: dict[str, Any] = json.loads(output.split("\n\n", 1)[1])["error"]
    return error


def test_sdk_snippet_prints_what_the_readme_says(quickstart: Stack) -> None:
    (snippet,) = quickstart_blocks("python")
    lines = run([sys.executable, "-c", snippet]).splitlines()
    tokens = "".join(f"tok{i} " for i in range(1, 25))  # the mocks' 24 tokens
    assert len(lines) == 3, lines
    model, _, content = lines[0].partition(" ")
    assert model in {"alpha-mini", "gpt-4o-mini"}  # alpha's name for it, or beta's answer
    assert content == tokens
    assert lines[1] == tokens  # the stream, joined
    assert lines[2] == "['deepseek-chat', 'gpt-4o-mini', 'qwen-plus']"


def _ratelimit_headers(output: str) -> None:
    headers = {
        name: value for name, _, value in (line.partition(": ") for line in output.splitlines())
    }
    assert len(headers) == 6, output
    assert headers["x-ratelimit-limit-requests"] == "600"
    assert headers["x-ratelimit-limit-tokens"] == "100000"
    assert {"x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} <= set(headers)


def _no_key(output: str) -> None:
    assert output.startswith("HTTP/1.1 401"), output
    assert error_of(output)["code"] == "missing_api_key"


def _too_large(output: str) -> None:
    assert output.startswith("HTTP/1.1 429"), output
    assert "\nx-should-retry: false\n" in output
    error = error_of(output)
    assert (error["code"], error["type"]) == ("request_too_large", "tokens")
    assert "retrying cannot help" in error["message"]


def _burst(output: str) -> None:
    counts = {code: int(count) for count, code in (line.split() for line in output.splitlines())}
    assert counts == {"200": 22, "503": 8}, output


def _metrics(output: str) -> None:
    samples = {
        name: value for name, _, value in (line.rpartition(" ") for line in output.splitlines())
    }
    decision = 'sluicegate_admission_decisions_total{outcome="%s",priority="%s"}'
    # The tour so far: the burst and one request refused as too large. Envoy's key check
    # refused the request without a key (the demo tenant is `lane: auto`): no decision.
    assert samples[decision % ("admitted", "batch")] == "22.0"
    assert samples[decision % ("shed_queue_full", "batch")] == "8.0"
    assert samples[decision % ("too_large", "interactive")] == "1.0"
    assert decision % ("unauthenticated", "none") not in samples
    depths = {k: v for k, v in samples.items() if k.startswith("sluicegate_queue_depth")}
    assert len(depths) == 3 and set(depths.values()) == {"0.0"}, depths


# What each tour block is recognised by, and what the README says it gives.
TOUR: tuple[tuple[str, Callable[[str], None]], ...] = (
    ("grep -i '^x-ratelimit'", _ratelimit_headers),
    ("/v1/models\n", _no_key),
    ('"max_tokens":200000', _too_large),
    ("$(seq 30)", _burst),
    ("9100/metrics", _metrics),
)


def test_curl_tour_gives_what_the_readme_says(quickstart: Stack) -> None:
    blocks = [body for body in quickstart_blocks("sh") if "127.0.0.1:" in body]
    assert len(blocks) == len(TOUR), "the README's tour changed: tell this test what it gives"
    for block, (marker, check) in zip(blocks, TOUR, strict=True):
        assert marker in block, f"tour block out of order or changed:\n{block}"
        check(run(["bash", "-c", block]))
