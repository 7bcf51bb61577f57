"""The request mix: which scenario each request belongs to, its prompt and its output
length, made into the request's bytes (head and body) ready to write.

Synthetic prompts are slices of one seeded random text of common words, each one token
for the usual tokenizers and four characters long (what the mock provider counts as a
token), starting at a random word: no two requests share a long prefix, so a server's
prefix cache does not flatter the figures.
"""

from __future__ import annotations

import bisect
import json
import random
from dataclasses import dataclass
from typing import Final

from sluicegate.bench.distributions import Lengths, parse_lengths
from sluicegate.bench.endpoint import Endpoint
from sluicegate.bench.prompts import PromptLine, load_prompts
from sluicegate.bench.spec import (
    DEFAULT_OUTPUT,
    PRIORITY_HEADER,
    SCENARIO_HEADER,
    BenchSpec,
    Scenario,
    SpecError,
)

DEFAULT_SCENARIO: Final = "default"
NO_PRIORITY: Final = "none"
CHAT_PATH: Final = "/v1/chat/completions"
_WORDS: Final = (
    " the", " and", " for", " you", " not", " are", " was", " but", " all", " can",
    " one", " our", " has", " had", " out", " new", " now", " may", " way", " who",
)  # fmt: skip
_TEXT_WORDS: Final = 1 << 16


@dataclass(frozen=True)
class Prepared:
    """One request, ready to send."""

    scenario: str
    priority: str
    data: bytes  # the whole HTTP request
    input_tokens: int | None  # what the bench asked for; None for a prompt file's line


class _Group:
    """One scenario's way to make requests."""

    def __init__(
        self,
        scenario: Scenario,
        head: bytes,
        lines: list[PromptLine],
        input_lengths: Lengths | None,
        output_lengths: Lengths | None,
        model: bytes,
    ) -> None:
        self.name = scenario.name
        self.model = model
        self.priority = scenario.priority or NO_PRIORITY
        self.head = head
        self.lines = lines
        self.input_lengths = input_lengths
        self.output_lengths = output_lengths


class Mix:
    """Makes requests for one worker; `seed` differs per worker."""

    def __init__(self, spec: BenchSpec, model: str, endpoint: Endpoint, seed: int) -> None:
        self._rng = random.Random(seed)
        self._text = "".join(self._rng.choices(_WORDS, k=_TEXT_WORDS)).encode()
        tail = b""
        if spec.stream:
            tail += b',"stream":true'
            if spec.stream_usage:
                tail += b',"stream_options":{"include_usage":true}'
        if spec.ignore_eos:
            tail += b',"ignore_eos":true'
        self._tail = tail + b"}"
        self._endpoint = endpoint
        self._groups = _groups(spec, endpoint, model)
        weights = [share for _, share in self._groups]
        total = sum(weights)
        self._cumulative = [sum(weights[: i + 1]) / total for i in range(len(weights))]
        self.scenarios = [group.name for group, _ in self._groups]
        self.priorities = sorted({group.priority for group, _ in self._groups})

    def next(self) -> Prepared:
        rng = self._rng
        index = bisect.bisect_right(self._cumulative, rng.random())
        group = self._groups[min(index, len(self._groups) - 1)][0]
        input_tokens: int | None = None
        max_tokens: int | None = None
        if group.lines:
            line = group.lines[rng.randrange(len(group.lines))]
            members = line.body_members
            max_tokens = line.max_tokens
        else:
            assert group.input_lengths is not None
            input_tokens = group.input_lengths.draw(rng)
            members = (
                b'"messages":[{"role":"user","content":"'
                + self._prompt_text(input_tokens)
                + b'"}]'
            )
        if max_tokens is None and group.output_lengths is not None:
            max_tokens = group.output_lengths.draw(rng)
        body = b'{"model":' + group.model + b"," + members
        if max_tokens is not None:
            body += b',"max_tokens":%d' % max_tokens
        body += self._tail
        data = group.head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        return Prepared(group.name, group.priority, data, input_tokens)

    def _prompt_text(self, tokens: int) -> bytes:
        width = len(_WORDS[0])
        if tokens <= _TEXT_WORDS:
            start = self._rng.randrange(_TEXT_WORDS - tokens + 1) * width
            return self._text[start : start + tokens * width]
        whole, rest = divmod(tokens, _TEXT_WORDS)
        return self._text * whole + self._text[: rest * width]


def _groups(spec: BenchSpec, endpoint: Endpoint, model: str) -> list[tuple[_Group, float]]:
    """Each scenario with its share. Without declared scenarios: the prompt file's lines
    grouped by their `scenario` (a share per line), or one scenario `default`."""
    lines = load_prompts(spec.prompts, "--prompts") if spec.prompts else []
    scenarios = list(spec.scenarios)
    named = bool(scenarios)
    if not scenarios:
        counts: dict[str, int] = {}
        for line in lines:
            name = line.scenario or DEFAULT_SCENARIO
            counts[name] = counts.get(name, 0) + 1
        scenarios = [Scenario(name, share=count) for name, count in counts.items()] or [
            Scenario(DEFAULT_SCENARIO)
        ]
        named = any(line.scenario for line in lines)
    declared = {s.name for s in scenarios}
    for line in lines:
        if line.scenario is not None and line.scenario not in declared:
            raise SpecError(
                "--prompts", f"a line names scenario {line.scenario!r}, which is not declared"
            )
    shared = [line for line in lines if line.scenario is None]
    synthetic_output = spec.output_lengths or parse_lengths(DEFAULT_OUTPUT)
    groups: list[tuple[_Group, float]] = []
    for scenario in scenarios:
        own: list[PromptLine] = []
        if scenario.prompts is not None:
            own = load_prompts(scenario.prompts, f"--scenario {scenario.name} prompts")
        elif lines:
            own = [line for line in lines if line.scenario == scenario.name]
            if not own and scenario.input_lengths is None:
                own = shared
        input_lengths = None if own else (scenario.input_lengths or spec.input_lengths)
        output_lengths = scenario.output_lengths or spec.output_lengths
        if not own and output_lengths is None:
            output_lengths = synthetic_output
        head = _head(spec, endpoint, scenario, send_name=named)
        group = _Group(
            scenario, head, own, input_lengths, output_lengths,
            json.dumps(scenario.model or model).encode(),
        )  # fmt: skip
        groups.append((group, scenario.share))
    return groups


def _head(spec: BenchSpec, endpoint: Endpoint, scenario: Scenario, send_name: bool) -> bytes:
    lines = [
        f"POST {endpoint.path_prefix}{CHAT_PATH} HTTP/1.1",
        f"Host: {endpoint.host_header}",
        "User-Agent: sluicegate-bench",
        "Content-Type: application/json",
        "Accept: text/event-stream" if spec.stream else "Accept: application/json",
    ]
    key = scenario.key or spec.key
    if key is not None:
        lines.append(f"Authorization: Bearer {key.reveal()}")
    if scenario.priority:
        lines.append(f"{PRIORITY_HEADER}: {scenario.priority}")
    if send_name:
        lines.append(f"{SCENARIO_HEADER}: {scenario.name}")
    lines.extend(f"{name}: {value}" for name, value in spec.headers)
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")
