"""Turning a store's raw numbers into a Decision, the same way for every store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .model import Decision, Limit, LimitState, StoreMode

US_PER_S: Final = 1_000_000

# Rule "bounded retry walk": retry_after walks the log oldest-first; after this
# many charges it stops and answers one whole window (always enough: by then
# every charge now in the window has left).
RETRY_WALK_CAP: Final = 1000


def make_decision(
    reservation_id: str,
    limits: Sequence[Limit],
    amounts: Sequence[int],
    used: Sequence[int],
    reset_us: Sequence[int],
    refused: int | None,
    too_large: bool,
    retry_us: int | None,
    store_mode: StoreMode,
) -> Decision:
    """`refused` is the index of the first refusing limit; times are in µs."""
    states = tuple(
        LimitState(
            limit=limit,
            used=u,
            remaining=max(0, limit.limit - u),
            reset_s=max(0, r) / US_PER_S,
        )
        for limit, u, r in zip(limits, used, reset_us, strict=True)
    )
    if refused is None:
        return Decision(
            admitted=True,
            reservation_id=reservation_id,
            states=states,
            refused_by=None,
            requested=0,
            retry_after_s=None,
            too_large=False,
            store_mode=store_mode,
        )
    return Decision(
        admitted=False,
        reservation_id=reservation_id,
        states=states,
        refused_by=limits[refused],
        requested=amounts[refused],
        retry_after_s=None if too_large or retry_us is None else max(0, retry_us) / US_PER_S,
        too_large=too_large,
        store_mode=store_mode,
    )


def unknown_decision(reservation_id: str, admitted: bool, store_mode: StoreMode) -> Decision:
    """A decision made without a store (fail_open, fail_closed): nothing counted,
    so no states and no culprit."""
    return Decision(
        admitted=admitted,
        reservation_id=reservation_id,
        states=(),
        refused_by=None,
        requested=0,
        retry_after_s=None,
        too_large=False,
        store_mode=store_mode,
    )
