"""Prompt files (`--prompts FILE.jsonl`): one request per line, with `messages` (a chat)
or `prompt` (a user message's text), optional `max_tokens` and `scenario`; any other
member (`temperature`, ...) goes into the request body as it is."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sluicegate.bench.spec import SpecError

# Members the bench sets itself: what a line says about them is replaced.
_OURS: Final = frozenset({"model", "stream", "stream_options", "ignore_eos"})


@dataclass(frozen=True)
class PromptLine:
    scenario: str | None
    body_members: bytes  # `"messages":[...],...` without braces, JSON-encoded once
    max_tokens: int | None


def load_prompts(path: str | Path, flag: str) -> list[PromptLine]:
    lines: list[PromptLine] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8"
        raise SpecError(flag, f"cannot read {path}: {reason}") from None
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            lines.append(_line(raw, f"{path}:{number}", flag))
    if not lines:
        raise SpecError(flag, f"{path} holds no prompts")
    return lines


def _line(raw: str, where: str, flag: str) -> PromptLine:
    try:
        entry: Any = json.loads(raw)
    except ValueError as err:
        raise SpecError(flag, f"{where}: not JSON ({err})") from None
    if not isinstance(entry, dict):
        raise SpecError(flag, f"{where}: expected a JSON object")
    scenario = entry.pop("scenario", None)
    if scenario is not None and (not isinstance(scenario, str) or not scenario.strip()):
        raise SpecError(flag, f"{where}: scenario must be a non-empty string")
    max_tokens = entry.pop("max_tokens", None)
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise SpecError(flag, f"{where}: max_tokens must be an integer >= 1")
    prompt = entry.pop("prompt", None)
    if prompt is not None:
        if "messages" in entry or not isinstance(prompt, str):
            raise SpecError(flag, f"{where}: give messages (a list) or prompt (a string)")
        entry["messages"] = [{"role": "user", "content": prompt}]
    messages = entry.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SpecError(flag, f"{where}: needs messages (a non-empty list) or prompt")
    members = {k: v for k, v in entry.items() if k not in _OURS}
    encoded = json.dumps(members, separators=(",", ":"), ensure_ascii=False).encode()
    return PromptLine(scenario.strip() if scenario else None, encoded[1:-1], max_tokens)
