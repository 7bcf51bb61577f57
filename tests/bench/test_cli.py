"""`sluicegate bench` as a user runs it: the JSON's keys, compare, --plot, the progress
line on a terminal, a key that never shows, and flags refused with exit status 2."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from sluicegate.cli import main
from sluicegate.provider import ThreadedMockProvider
from tests.bench.helpers import SECRET, bench

PERCENTILES = {"unit", "count", "mean", "p50", "p90", "p95", "p99", "max", "min"}


def test_json_has_every_figure(mock: ThreadedMockProvider, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    result = bench("--url", mock.url, "--concurrency", "2", "--requests", "12", "--quiet",
                   "--slo", "ttft_p95=2s,tpot_p95=80ms,error_rate=1%", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[3].startswith("all")
    document = json.loads(out.read_text())
    for metric in ("ttft", "tpot", "itl", "e2e"):
        assert set(document[metric]) == PERCENTILES and document[metric]["unit"] == "s"
        assert document[metric]["p99"] is not None
    for key in ("requests_per_s", "output_tokens_per_s", "goodput", "errors", "refusals",
                "queue", "scenarios", "priorities", "parameters", "timeline", "error_rate",
                "slo", "client"):  # fmt: skip
        assert key in document, key
    assert document["goodput"]["percent"] == 100.0
    assert document["queue"] is None  # the mock reports no queue time
    assert set(document["scenarios"]) == {"default"}
    assert set(document["scenarios"]["default"]) >= {"ttft", "tpot", "itl", "e2e", "goodput"}
    assert document["parameters"]["key"] is None
    assert document["parameters"]["concurrency"] == 2
    assert "steps" not in document


def test_compare_prints_both_runs_and_the_ratio(start_upstream: Any, tmp_path: Path) -> None:
    upstream = start_upstream(latency_ms=2)
    runs = []
    for concurrency in ("1", "2"):
        path = tmp_path / f"c{concurrency}.json"
        result = bench("--url", upstream.url, "--no-stream", "--concurrency", concurrency,
                       "--requests", "20", "--json", str(path), "--quiet")  # fmt: skip
        assert result.returncode == 0, result.stderr
        runs.append(str(path))
    result = bench("compare", *runs)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("A: ") and "concurrency 1" in lines[0]
    assert "concurrency 2" in lines[1]
    rate = next(line for line in lines if line.startswith("requests/s"))
    assert float(rate.split()[-1]) > 0  # B/A
    assert any(line.startswith("e2e p99") for line in lines)
    missing = bench("compare", runs[0], str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "none.json" in missing.stderr


def test_plot_writes_a_png_for_a_sweep(start_upstream: Any, tmp_path: Path) -> None:
    upstream = start_upstream(latency_ms=5, max_inflight=2)
    plot = tmp_path / "sweep.png"
    result = bench("--url", upstream.url, "--no-stream", "--concurrency", "1", "--requests",
                   "20", "--sweep", "--slo", "error_rate=0%", "--plot", str(plot), "--quiet",
                   "--processes", "1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "capacity: concurrency 2" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _run_on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """The command with its stderr on a pseudo-terminal (so it draws the progress line)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "sluicegate", "bench", *args],
                               stdout=subprocess.PIPE, stderr=follower, env=env)  # fmt: skip
    os.close(follower)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(leader, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    stdout, _ = process.communicate(timeout=60)
    reader.join(timeout=5)
    os.close(leader)
    return process.returncode, stdout.decode(), b"".join(chunks).decode(errors="replace")


def test_the_key_never_shows(keyed_mock: ThreadedMockProvider, tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_TEST_KEY": SECRET}
    out = tmp_path / "run.json"
    status, stdout, terminal = _run_on_a_terminal(
        ["--url", keyed_mock.url, "--api-key-env", "BENCH_TEST_KEY", "--concurrency", "4",
         "--duration", "1.2", "--processes", "2", "--json", str(out)], env,
    )  # fmt: skip
    assert status == 0, terminal
    assert "sent " in terminal and "ttft p95" in terminal  # the progress line was drawn
    document = json.loads(out.read_text())
    assert document["requests"]["ok"] > 0 and document["errors"]["total"] == 0
    assert document["parameters"]["key"] == "given"
    # On the command line too (the user's choice, warned about in --help); and with a
    # wrong key, the errors it makes.
    direct = bench("--url", keyed_mock.url, "--api-key", SECRET, "--requests", "3",
                   "--concurrency", "1", "--json", str(tmp_path / "direct.json"))  # fmt: skip
    wrong = bench("--url", keyed_mock.url, "--api-key", SECRET + "-wrong", "--requests", "3",
                  "--concurrency", "1")  # fmt: skip
    assert wrong.returncode == 1 and "HTTP 401 (invalid_api_key)" in wrong.stderr
    wrong_model = bench("--url", keyed_mock.url, "--api-key", SECRET + "-wrong", "--model",
                        "m1", "--requests", "3", "--concurrency", "1", "--json",
                        str(tmp_path / "wrong.json"))  # fmt: skip
    assert "invalid_api_key" in wrong_model.stdout
    texts = [stdout, terminal, direct.stdout, direct.stderr, wrong.stdout, wrong.stderr,
             wrong_model.stdout, wrong_model.stderr]  # fmt: skip
    texts += [path.read_text() for path in tmp_path.glob("*.json")]
    for text in texts:
        assert SECRET not in text


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        ([], "--url"),
        (["--url", "http://127.0.0.1:9", "--requests", "1"], "--concurrency"),
        (["--url", "http://127.0.0.1:9", "--rate", "5"], "--duration"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--concurrency", "2",
          "--requests", "1"], "--concurrency"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--slo", "ttft_p97=2s"], "--slo"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--input-tokens", "normal:5"], "--input-tokens"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--duration", "soon"], "--duration"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1", "--sweep"],
         "--sweep"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--scenario", "name=a,key=sk-inline-1"], "--scenario"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--api-key-env", "BENCH_UNSET_VAR"], "--api-key-env"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--prompts", "/nonexistent.jsonl"], "--prompts"),
        (["--url", "ftp://x", "--rate", "5", "--requests", "1"], "--url"),
        (["--url", "http://127.0.0.1:9", "--concurrency", "0", "--requests", "1"],
         "--concurrency"),
        # A key given to the wrong flag is never printed back.
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--api-key-env", "sk-inline-1"], "--api-key-env"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--api-key-file", "sk-inline-1"], "--api-key-file"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--scenario", "name=a,sk-inline-1"], "--scenario"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--scenario", "name=a,key-env=sk-inline-1"], "--scenario"),
        (["--url", "sk-inline-1", "--rate", "5", "--requests", "1"], "--url"),
        (["--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
          "--api=sk-inline-1"], "--api"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_naming_the_flag(
    args: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        status = main(["bench", *args])
    except SystemExit as exit:  # argparse's own checks
        status = int(exit.code or 0)
    captured = capsys.readouterr()
    assert status == 2, (captured.out, captured.err)
    assert flag in captured.err, captured.err
    assert "sk-inline-1" not in captured.err


def test_a_bad_flag_in_a_subprocess() -> None:
    result = bench("--url", "http://127.0.0.1:9", "--rate", "5", "--requests", "1",
                   "--slo", "tpot_p95=80")  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("sluicegate bench: error: --slo: 'tpot_p95=80'")


def test_an_unreachable_url_exits_1() -> None:
    result = bench("--url", "http://127.0.0.1:9", "--concurrency", "1", "--requests", "1")
    assert result.returncode == 1
    assert "cannot connect to http://127.0.0.1:9/v1/models" in result.stderr


def test_plot_without_matplotlib_is_refused_before_any_request(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sluicegate.bench.cli.plotting_available", lambda: False)
    status = main(["bench", "--url", "http://127.0.0.1:9", "--rate", "1", "--requests", "1",
                   "--plot", "out.png"])  # fmt: skip
    assert status == 2
    assert "--plot: needs matplotlib: pip install 'sluicegate[plot]'" in capsys.readouterr().err


def test_fixed_upstream_command_with_two_workers() -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "sluicegate.bench.fixed_upstream", "--port", "0", "--workers",
         "2", "--output-tokens", "5"], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]
        result = bench("--url", url, "--no-stream", "--concurrency", "4", "--requests", "40",
                       "--quiet")  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[3].split()[1:3] == ["40", "100.0"]
    finally:
        server.terminate()
        assert server.wait(timeout=10) is not None
