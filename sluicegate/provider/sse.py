"""Server-sent-event framing of OpenAI streaming chunks."""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def dumps(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def sse_event(payload: Any) -> bytes:
    return b"data: " + dumps(payload).encode() + b"\n\n"


class ChunkEncoder:
    """Frames the chunks of one stream.

    The fields shared by every chunk (id, object, created, model, ...) are serialised once;
    only `choices` (and `usage`) are encoded per token, which keeps the mock cheap under
    benchmark load.
    """

    def __init__(
        self,
        *,
        completion_id: str,
        object_type: str,
        created: int,
        model: str,
        include_usage: bool,
    ) -> None:
        head: dict[str, Any] = {
            "id": completion_id,
            "object": object_type,
            "created": created,
            "model": model,
            "system_fingerprint": "fp_mock",
        }
        self._head = b"data: " + dumps(head)[:-1].encode() + b',"choices":'
        # OpenAI sends "usage": null on every chunk once include_usage is requested.
        self._tail = b',"usage":null}\n\n' if include_usage else b"}\n\n"

    def choices(self, choices: list[dict[str, Any]]) -> bytes:
        return self._head + dumps(choices).encode() + self._tail

    def usage(self, usage: dict[str, int]) -> bytes:
        return self._head + b'[],"usage":' + dumps(usage).encode() + b"}\n\n"
