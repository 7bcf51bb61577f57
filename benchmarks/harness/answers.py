"""Reading the gateway's answers in benchmarks."""

from __future__ import annotations

import json


def error_code(raw: bytes) -> str:
    """An OpenAI error body's `code` (or `type`); "non-json" for a body that is not one."""
    try:
        error = json.loads(raw)["error"]
        return str(error.get("code") or error.get("type"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "non-json"
