"""`sluicegate hash-key`: hash a client key (argument, stdin, prompt) or make a new one."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest

from sluicegate.cli import main
from sluicegate.config import verify_key

HASH_LINE = re.compile(r'hash: "(sha256:[0-9a-f]{32}:[0-9a-f]{64})"')


def hash_in(output: str) -> str:
    match = HASH_LINE.search(output)
    assert match, output
    return match.group(1)


class FakeStdin(io.StringIO):
    def __init__(self, text: str, *, tty: bool) -> None:
        super().__init__(text)
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_key_from_stdin_as_a_user_pipes_it() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "hash-key"],
        input="  sk-sg-piped  \n",
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert HASH_LINE.fullmatch(result.stdout.strip())
    assert verify_key("sk-sg-piped", hash_in(result.stdout))
    assert "sk-sg-piped" not in result.stdout + result.stderr


def test_only_the_first_stdin_line_is_the_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", FakeStdin("sk-sg-first\nsk-sg-second\n", tty=False))
    assert main(["hash-key"]) == 0
    assert verify_key("sk-sg-first", hash_in(capsys.readouterr().out))


def test_key_as_an_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-key", "sk-sg-arg"]) == 0
    captured = capsys.readouterr()
    assert verify_key("sk-sg-arg", hash_in(captured.out))
    assert "sk-sg-arg" not in captured.out + captured.err


def test_prompt_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts: list[str] = []

    def fake_getpass(prompt: str = "") -> str:
        prompts.append(prompt)
        return "sk-sg-typed"

    monkeypatch.setattr(sys, "stdin", FakeStdin("", tty=True))
    monkeypatch.setattr("getpass.getpass", fake_getpass)
    assert main(["hash-key"]) == 0
    assert prompts == ["API key to hash: "]
    assert verify_key("sk-sg-typed", hash_in(capsys.readouterr().out))


@pytest.mark.parametrize("stdin", ["", "\n", "   \n"])
def test_empty_key_exits_2(
    stdin: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", FakeStdin(stdin, tty=False))
    assert main(["hash-key"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "the key is empty" in captured.err


def test_empty_prompt_answer_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(prompt: str = "") -> str:
        raise EOFError

    monkeypatch.setattr(sys, "stdin", FakeStdin("", tty=True))
    monkeypatch.setattr("getpass.getpass", interrupted)
    assert main(["hash-key"]) == 2
    assert "the key is empty" in capsys.readouterr().err


def test_generate_prints_a_labelled_key_and_its_hash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-key", "--generate"]) == 0
    out = capsys.readouterr().out
    key_line = re.search(r"^key: (sk-sg-[A-Za-z0-9_-]{32})$", out, re.MULTILINE)
    assert key_line, out
    assert verify_key(key_line.group(1), hash_in(out))
    assert "give it to the client" in out
    assert "Paste under tenants[].keys[]" in out
    # Everything but the two value lines is a YAML comment.
    others = [line for line in out.splitlines() if not line.startswith(("key: ", "hash: "))]
    assert others and all(line.startswith("# ") for line in others)


def test_generate_makes_a_new_key_each_time(capsys: pytest.CaptureFixture[str]) -> None:
    main(["hash-key", "--generate"])
    main(["hash-key", "--generate"])
    keys = re.findall(r"^key: (\S+)$", capsys.readouterr().out, re.MULTILINE)
    assert len(set(keys)) == 2


def test_generate_with_a_key_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-key", "--generate", "sk-sg-x"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "not both" in captured.err
