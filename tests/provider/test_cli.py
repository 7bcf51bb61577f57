"""Flags -> settings, the blocking entry point in a subprocess, and the threaded runner."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from sluicegate.provider import (
    Fault,
    MockProviderSettings,
    add_mock_provider_arguments,
    settings_from_args,
    start_mock_provider_thread,
)


def parse(*argv: str) -> MockProviderSettings:
    parser = argparse.ArgumentParser()
    add_mock_provider_arguments(parser)
    return settings_from_args(parser.parse_args(argv))


def test_flags_map_to_settings() -> None:
    settings = parse(
        "--port", "18081", "--name", "alpha", "--api-key", "sk-1",
        "--models", "gpt-4o-mini, m2", "--ttft-ms", "50", "--itl-ms", "7",
        "--jitter-ms", "2", "--output-tokens", "32", "--rate-429", "0.1",
        "--rate-reset", "0.05", "--retry-after-s", "3", "--seed", "9", "--early-headers",
    )  # fmt: skip
    assert settings == MockProviderSettings(
        name="alpha", port=18081, api_key="sk-1", models=["gpt-4o-mini", "m2"],
        ttft_ms=50, itl_ms=7, jitter_ms=2, output_tokens=32, rate_429=0.1,
        rate_reset=0.05, retry_after_s=3, seed=9, early_headers=True,
    )  # fmt: skip
    assert parse() == MockProviderSettings()


def test_api_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOCK_KEY", "sk-env")
    assert parse("--api-key-env", "MOCK_KEY").api_key == "sk-env"
    with pytest.raises(ValueError, match="NOPE_UNSET"):
        parse("--api-key-env", "NOPE_UNSET")


def test_inconsistent_flags_are_rejected() -> None:
    with pytest.raises(ValueError, match="add up"):
        parse("--rate-500", "0.7", "--rate-503", "0.7")
    with pytest.raises(ValueError, match="together"):
        parse("--tls-cert", "cert.pem")


def _get_json(url: str, headers: dict[str, str] | None = None) -> object:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def test_module_entry_point_serves_and_stops_on_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "sluicegate.provider", "--port", "0", "--name", "cli",
         "--models", "m1", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, line
        models = _get_json(match.group(1) + "/v1/models")
        assert models == {
            "object": "list",
            "data": [{"id": "m1", "object": "model", "created": 1700000000, "owned_by": "cli"}],
        }
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
        assert process.returncode == 0, stderr
        assert "Traceback" not in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_threaded_provider_for_sync_callers() -> None:
    with start_mock_provider_thread(MockProviderSettings(name="bg", ttft_ms=1)) as provider:
        models = _get_json(provider.url + "/v1/models")
        assert models == {"object": "list", "data": []}
        stats = provider.stats()
        assert (stats["name"], stats["requests_total"]) == ("bg", 1)
        assert provider.configure(output_tokens=2).output_tokens == 2
        provider.reset_stats()
        assert provider.stats()["requests_total"] == 0


def _mock_request_headers() -> set[str]:
    """Every x-mock-* name the mock's fault module spells out (what it reads per request)."""
    from sluicegate.provider import faults

    return set(re.findall(r'"(x-mock-[a-z0-9-]+)"', Path(faults.__file__).read_text()))


@pytest.mark.parametrize(
    "command",
    [["-m", "sluicegate", "mock-provider"], ["-m", "sluicegate.provider"]],
    ids=["sluicegate-mock-provider", "python-m-sluicegate.provider"],
)
def test_help_lists_every_request_header(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, *command, "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    headers = _mock_request_headers()
    assert {"x-mock-fault", "x-mock-ttft-ms", "x-mock-output-tokens"} <= headers
    epilog = result.stdout.split("request headers", 1)[-1]
    listed = set(re.findall(r"^  (x-mock-[a-z0-9-]+) ", epilog, flags=re.MULTILINE))
    assert listed == headers, result.stdout
    for fault in Fault:
        assert fault.value in epilog, fault
