"""PendingCharges: the fast-lane charges of one batch of records, summed per client, so
the store takes one charge per client and batch instead of one per request
(charge.charge_fast_lane; docs/fast-lane.md, "The exact lane counts what the fast lane
admitted")."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..limiter import Limit, Usage


@dataclass(slots=True)
class _Sum:
    limits: Sequence[Limit]
    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0


class PendingCharges:
    """What the short requests of a batch were billed, per (tenant, key): added while the
    batch's records are read, taken once at its end."""

    __slots__ = ("_sums",)

    def __init__(self) -> None:
        self._sums: dict[tuple[str, str], _Sum] = {}

    def __len__(self) -> int:
        return len(self._sums)

    def add(self, tenant: str, key: str, limits: Sequence[Limit], used: Usage) -> None:
        """One request of `tenant`'s `key` with the client's `limits` (the same for every
        request of one client under one policy) billed `used`."""
        found = self._sums.get((tenant, key))
        if found is None:
            found = self._sums[(tenant, key)] = _Sum(limits)
        found.input_tokens += used.input_tokens
        found.output_tokens += used.output_tokens
        found.requests += used.requests

    def take(self) -> Iterator[tuple[Sequence[Limit], Usage]]:
        """Each client's limits and summed usage; empty afterwards."""
        sums, self._sums = self._sums, {}
        for found in sums.values():
            yield found.limits, Usage(found.input_tokens, found.output_tokens, found.requests)
