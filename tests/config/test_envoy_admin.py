"""`sluicegate.envoy_admin` (issue 9, part 7): a Unix socket `unix:/path` or TCP; a TCP
admin beyond loopback is a warning located by file, line and key; the quickstart stays
quiet."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sluicegate.config import load_config_text, parse_admin_address
from sluicegate.testing import EXAMPLES

from .helpers import MINIMAL, only, problems_of


def with_admin(address: str) -> str:
    # `sluicegate:` right after `version: 1`, so envoy_admin is on line 3.
    return MINIMAL.replace("version: 1\n", f"version: 1\nsluicegate:\n  envoy_admin: '{address}'\n")


def test_a_unix_socket_admin_is_valid_quiet_and_takes_no_port() -> None:
    # Port 9901 is free for a listener once the admin is off TCP.
    text = with_admin("unix:/run/sluicegate/admin.sock").replace("port: 10000", "port: 9901")
    assert problems_of(text) == []
    config = load_config_text(text, "t.yaml")
    assert config.sluicegate.envoy_admin == "unix:/run/sluicegate/admin.sock"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("unix:admin.sock", "expected unix:/absolute/path, got 'unix:admin.sock'"),
        ("unix:/run/", "expected unix:/absolute/path to a file, got 'unix:/run/'"),
        ("unix:/" + "a" * 107, "a Unix socket path is at most 107 bytes, got 108"),
        ("nope", "expected host:port, got 'nope'"),
    ],
)
def test_a_malformed_admin_address_is_an_error_at_its_line(address: str, reason: str) -> None:
    problem = only(problems_of(with_admin(address)))
    assert (problem.file, problem.line, problem.key_path) == ("t.yaml", 3, "sluicegate.envoy_admin")
    assert problem.is_error
    assert reason in problem.message


@pytest.mark.parametrize("address", ["0.0.0.0:9901", "10.1.2.3:9901", "[::]:9901", "envoy:9901"])
def test_an_admin_beyond_loopback_is_a_warning_at_its_line(address: str) -> None:
    problem = only(problems_of(with_admin(address)))
    assert (problem.file, problem.line, problem.key_path, problem.severity) == (
        "t.yaml",
        3,
        "sluicegate.envoy_admin",
        "warning",
    )
    assert f"Envoy's admin on {address} is reachable from other machines" in problem.message
    assert "unix:/path/admin.sock" in problem.message


@pytest.mark.parametrize("address", ["127.0.0.1:9901", "127.0.0.2:9901", "[::1]:9901",
                                     "localhost:9901"])  # fmt: skip
def test_an_admin_on_loopback_is_quiet(address: str) -> None:
    assert problems_of(with_admin(address)) == []


def test_loopback_is_told_apart_from_everything_else() -> None:
    assert parse_admin_address("unix:/x/admin.sock").is_loopback
    assert parse_admin_address("127.9.9.9:1").is_loopback
    assert not parse_admin_address("192.168.0.1:1").is_loopback
    assert not parse_admin_address("admin.internal:1").is_loopback


def test_validate_on_the_quickstart_prints_no_warning() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "validate", str(EXAMPLES / "quickstart.yaml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning" not in (result.stdout + result.stderr).lower()
