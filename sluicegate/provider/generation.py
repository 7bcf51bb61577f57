"""What the mock 'generates': token text, token counts and the pacing of tokens."""

from __future__ import annotations

import asyncio
import random
from typing import Any


def token_text(index: int) -> str:
    """The text of output token `index` (1-based): 'tok1 ', 'tok2 ', ..."""
    return f"tok{index} "


def completion_text(tokens: int) -> str:
    return "".join(token_text(i) for i in range(1, tokens + 1))


def _text_of(content: Any) -> int:
    # Message content is a string or a list of parts ({"type": "text", "text": ...}).
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(_text_of(part) for part in content)
    if isinstance(content, dict):
        text = content.get("text")
        return len(text) if isinstance(text, str) else 0
    return 0


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """~4 characters per token over message contents (or `prompt`), at least 1."""
    chars = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                chars += _text_of(message.get("content"))
    chars += _text_of(body.get("prompt"))
    return max(1, (chars + 3) // 4)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Pacer:
    """Sleeps until each token is due: first after TTFT, then every ITL (± jitter).

    Deadlines are absolute (start + accumulated delays), so time spent writing a chunk does
    not push every later token back and the stream's E2E stays what was configured. No
    token comes before its deadline by the loop's clock (its timers may fire up to about
    1 ms late); that clock (uvloop's) counts whole milliseconds, so a configured TTFT is a
    lower bound within 1 ms, which is what a test may rely on.
    `start` (the loop's time) is when the request arrived: the TTFT counts from there, not
    from after the mock read and parsed the body.
    """

    def __init__(
        self,
        *,
        ttft_ms: float,
        itl_ms: float,
        jitter_ms: float,
        rng: random.Random,
        start: float | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() if start is None else start
        self._ttft = ttft_ms / 1000
        self._itl = itl_ms / 1000
        self._jitter = jitter_ms / 1000
        self._rng = rng
        self._tokens = 0

    def _delay(self, base: float) -> float:
        if self._jitter:
            base += self._rng.uniform(-self._jitter, self._jitter)
        return max(0.0, base)

    async def next_token(self) -> None:
        self._deadline += self._delay(self._ttft if self._tokens == 0 else self._itl)
        self._tokens += 1
        wait = self._deadline - self._loop.time()
        if wait > 0:
            await asyncio.sleep(wait)

    async def all_tokens(self, tokens: int) -> None:
        """For non-streamed answers: wait as long as generating `tokens` would take."""
        for _ in range(tokens):
            self._deadline += self._delay(self._ttft if self._tokens == 0 else self._itl)
            self._tokens += 1
        wait = self._deadline - self._loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
