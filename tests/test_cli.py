"""The `sluicegate` command as a user runs it: validate and bootstrap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluicegate.envoy import find_envoy_binary

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def sluicegate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluicegate", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_validate_accepts_the_quickstart() -> None:
    result = sluicegate("validate", str(EXAMPLES / "quickstart.yaml"))
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_validate_reports_every_problem_with_file_line_and_key(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "version: 1\n"
        "listeners:\n"
        "  - {name: gw, port: 10000}\n"
        "providers:\n"
        "  - name: alpha\n"
        "    base_url: ftp://nowhere\n"
        "routes:\n"
        "  - name: r\n"
        "    models: [m]\n"
        "    backends:\n"
        "      - {provider: gamma, weigth: 2}\n"
    )
    result = sluicegate("validate", str(broken))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert any(line.startswith(f"{broken}:6:") and "base_url" in line for line in lines), lines
    assert any(f"{broken}:11:" in line and "gamma" in line for line in lines), lines
    assert any(f"{broken}:11:" in line and "weigth" in line for line in lines), lines


@pytest.mark.e2e
def test_bootstrap_is_accepted_by_envoy(tmp_path: Path) -> None:
    result = sluicegate("bootstrap", "--node-id", "sidecar-1", "--control-plane", "127.0.0.1:18000")
    assert result.returncode == 0, result.stderr
    path = tmp_path / "bootstrap.yaml"
    path.write_text(result.stdout)
    envoy = find_envoy_binary()
    check = subprocess.run([envoy, "--mode", "validate", "-c", str(path)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "sidecar-1" in result.stdout
