"""Plain-int request counters by stage and outcome (exported as metrics later)."""

from __future__ import annotations

from collections import defaultdict
from typing import Final

# Outcomes, one per request and stage.
ROUTED: Final = "routed"
MODEL_NOT_FOUND: Final = "model_not_found"
BAD_REQUEST: Final = "bad_request"
NO_BODY: Final = "no_body"  # routing: bodiless request left to Envoy's non-model routes
REWRITTEN: Final = "rewritten"  # attempt: the body's model was mapped for the provider
FORWARDED: Final = "forwarded"  # attempt: body kept as sent (path/headers may change)
BAD_METADATA: Final = "bad_metadata"
INTERNAL_ERROR: Final = "internal_error"
UNKNOWN_STAGE: Final = "unknown_stage"


class Counters:
    """Counts requests per (stage, outcome). Single event loop: no lock needed."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: defaultdict[tuple[str, str], int] = defaultdict(int)

    def inc(self, stage: str, outcome: str) -> None:
        self._counts[stage, outcome] += 1

    def get(self, stage: str, outcome: str) -> int:
        return self._counts.get((stage, outcome), 0)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """`{stage: {outcome: count}}`, a copy."""
        result: dict[str, dict[str, int]] = {}
        for (stage, outcome), count in self._counts.items():
            result.setdefault(stage, {})[outcome] = count
        return result
