"""sluicegate's own logs hold no key at any log level (issue 9, part 7): the control plane,
the ext_proc server and the mock providers run at DEBUG while clients send good, wrong and
streamed requests and a provider key is rotated; no client or provider key may appear in
any of their logs. (Envoy's own log is Envoy's: docs/operations.md says how its admin is
kept from turning on debug logging.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from openai import APIStatusError, OpenAI

from sluicegate.testing import quickstart_on_free_ports
from tests.e2e.stack import Stack, _wait_serving

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CLIENT_KEY = "sk-sluicegate-demo"  # the quickstart tenant's key
WRONG_KEY = "sk-wrong-but-still-a-secret-5d1e"
ROTATED = "sk-mock-alpha-rotated-0b9d"


def test_no_key_reaches_a_log_at_debug(tmp_path: Path) -> None:
    doc = quickstart_on_free_ports(tmp_path)
    provider_keys = [p.read_text().strip() for p in sorted((tmp_path / "keys").glob("*.key"))]
    config = tmp_path / "sluicegate.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    work = tmp_path / "work"
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "--verbose", "up", str(config),
             "--work-dir", str(work), "--envoy-concurrency", "1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    stack = Stack(config, doc, process, log_path)
    try:
        _wait_serving(stack, 30.0)
        base = stack.gateway + "/v1"
        sdk = OpenAI(base_url=base, api_key=CLIENT_KEY, max_retries=0)
        messages = [{"role": "user", "content": "hello"}]
        sdk.chat.completions.create(model="qwen-plus", messages=messages)  # type: ignore[arg-type]
        for _ in sdk.chat.completions.create(
            model="qwen-plus", messages=messages, stream=True,  # type: ignore[arg-type]
        ):
            pass
        sdk.models.list()
        with pytest.raises(APIStatusError):
            OpenAI(base_url=base, api_key=WRONG_KEY, max_retries=0).models.list()
        # A rotated provider key is read and pushed (logged as a reload, never as a value;
        # the mock keeps the old one, so no request is sent after it).
        (tmp_path / "keys" / "alpha.key").write_text(ROTATED + "\n")
        deadline = time.monotonic() + 15
        while log_path.read_text(errors="replace").count("published") < 2:
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)

    logs = {log_path: log_path.read_text(errors="replace")}
    logs |= {p: p.read_text(errors="replace") for p in work.glob("*.log") if p.name != "envoy.log"}
    assert "DEBUG" in logs[log_path]  # it really ran at debug level
    assert len(logs) > 1, sorted(logs)  # the mock providers' logs are read too
    for key in (CLIENT_KEY, WRONG_KEY, ROTATED, *provider_keys):
        for path, text in logs.items():
            assert key not in text, f"{key[:6]}… appears in {path.name}"
