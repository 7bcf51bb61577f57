"""The token estimate admission reserves against, before the provider has said anything.

No tokenizer ships offline for every provider, and the reservation is corrected
by the real usage when the response ends, so the estimate only has to be cheap
and rarely low. It is read from the raw JSON text of the prompt members (their
spans in the body: no re-serialization):

    tokens = ceil(ascii_chars / 4) + non_ascii_chars

- ASCII English runs about four characters per token in the GPT-4/4o
  tokenizers (and Llama's, Mistral's).
- Other scripts run about one token per character or more for CJK (fewer for
  Cyrillic, Greek, accented Latin), so one per character errs high.
- JSON escapes count as their escaped text: `\\u4e2d` is 6 ASCII characters,
  1.5 tokens; `\\n` is 2 characters. Close to reality for CJK sent escaped.
- The JSON framing is counted as text. It stands in for the per-message
  overhead real chat templates add (OpenAI documents about 3 tokens a message
  and 3 to prime the reply): `{"role":"user","content":""}` alone is 28
  characters, 7 tokens here. So no separate per-message constant is added.

Known errors:
- Images sent as base64 data URLs are counted as text, hugely over: a 1 MB
  image is about 330,000 tokens here, while providers bill a few hundred to a
  couple of thousand per image (by size in tiles). Audio and file parts alike.
- Random-looking ASCII (hashes, UUIDs, base64 inside text, long digit runs)
  tokenizes at 2-3 characters per token, so it is counted low, by up to half.
- Whitespace runs and repeated punctuation tokenize densely and are counted high.
- Emoji and rare characters may take 2-3 tokens each and are counted low.

Output is estimated as what the client allows: `(max_tokens or default) * n`.

Everything is O(len) in C: `str.isascii()` is a flag check in CPython, and
the ASCII count of a non-ASCII span is the length of its ASCII-only encoding.
"""

from __future__ import annotations

from collections.abc import Iterable

CHARS_PER_TOKEN = 4  # for ASCII text


def _ascii_count(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("ascii", "ignore"))


def estimate_text_tokens(text: str) -> int:
    """The estimate for one piece of raw JSON text (or plain text)."""
    ascii_chars = _ascii_count(text)
    return -(-ascii_chars // CHARS_PER_TOKEN) + (len(text) - ascii_chars)


def estimate_span_tokens(text: str, spans: Iterable[tuple[int, int]]) -> int:
    """The estimate over `text[start:end]` for each span, rounded up once."""
    ascii_chars = 0
    other = 0
    if text.isascii():  # the usual body (json.dumps escapes by default): no copies
        for start, end in spans:
            ascii_chars += max(end - start, 0)
    else:
        for start, end in spans:
            part = text[start:end]
            counted = _ascii_count(part)
            ascii_chars += counted
            other += len(part) - counted
    return -(-ascii_chars // CHARS_PER_TOKEN) + other


def estimate_output_tokens(max_tokens: int | None, n: int, default_max_tokens: int) -> int:
    """What the response may cost at most: the client's cap (or the default), per choice."""
    return (default_max_tokens if max_tokens is None else max_tokens) * n
