"""An `auto` tenant's usage over one window, for lane steering (docs/fast-lane.md, "The
auto lane").

One `UsageLog` per set of rate limits (a tenant's own, or one key's: all of a set's limits
share its `per`), counting every kind at once, so a limit added by a reload finds its
usage already counted. A charge counts while now < its time + the window, as the exact
lane's sliding windows count (filters/limiter/memory.py); running totals make a charge
and a read O(1) amortised: each entry is appended once and pruned once.

Charges closer together than 1/SLOTS of the window share one entry, stamped with the
newest charge's time. So memory stays bounded however fast a tenant sends (at most
SLOTS + 2 entries: they start a slot apart, and the oldest held ends inside the window),
and a charge counts at most 1/SLOTS of the window longer than its own window, never
shorter: steering errs toward the exact lane.
"""

from __future__ import annotations

from collections import deque
from typing import Final, NamedTuple

from sluicegate.config import LimitKind

SLOTS: Final = 100


class Usage(NamedTuple):
    """What a window holds: requests and tokens billed (records/billing.py)."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def of(self, kind: LimitKind) -> int:
        """The amount a limit of `kind` counts (config.LIMIT_KINDS)."""
        if kind == "requests":
            return self.requests
        if kind == "tokens":
            return self.tokens
        if kind == "input_tokens":
            return self.input_tokens
        return self.output_tokens


class Entry:
    """Charges made from `first` to `last` (seconds, the steering's clock); `held` until it
    leaves the window."""

    __slots__ = ("first", "held", "input_tokens", "last", "output_tokens", "requests")

    def __init__(self, now: float, requests: int, input_tokens: int, output_tokens: int) -> None:
        self.first = self.last = now
        self.held = True
        self.requests = requests
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens


class UsageLog:
    """A sliding-window log of charges with running totals (module docstring)."""

    __slots__ = ("_entries", "_input", "_output", "_requests", "_slot_s", "window_s")

    def __init__(self, window_s: float) -> None:
        self._entries: deque[Entry] = deque()
        self._requests = self._input = self._output = 0
        self.window_s = self._slot_s = 0.0
        self.set_window(window_s)

    def set_window(self, window_s: float) -> None:
        """Count over `window_s` from now on (a reload changed `per`): what the log holds
        stays, so a longer window starts with what the shorter one still held."""
        if not window_s > 0:
            raise ValueError(f"a usage window must be positive, got {window_s}")
        self.window_s = window_s
        self._slot_s = window_s / SLOTS

    def __len__(self) -> int:
        """Entries held (at most SLOTS + 2)."""
        return len(self._entries)

    def add(self, now: float, requests: int, input_tokens: int, output_tokens: int) -> Entry:
        """Charge one record at `now` (never earlier than the last charge's time); the
        entry that holds it (for `adjust`)."""
        entries = self._entries
        if entries:
            self._prune(now)  # so a tenant never read (no tick) holds no more either
        if entries:
            newest = entries[-1]
            now = max(now, newest.last)  # a clock never goes back; a log never does either
            if now - newest.first < self._slot_s:
                newest.last = now
                newest.requests += requests
                newest.input_tokens += input_tokens
                newest.output_tokens += output_tokens
                self._add_totals(requests, input_tokens, output_tokens)
                return newest
        entry = Entry(now, requests, input_tokens, output_tokens)
        entries.append(entry)
        self._add_totals(requests, input_tokens, output_tokens)
        return entry

    def adjust(self, entry: Entry, requests: int, input_tokens: int, output_tokens: int) -> None:
        """Change a charge `entry` holds by these amounts, in place: it keeps its time, as
        the exact lane reconciles a reservation. Nothing once the entry left the window."""
        if not entry.held:
            return
        entry.requests += requests
        entry.input_tokens += input_tokens
        entry.output_tokens += output_tokens
        self._add_totals(requests, input_tokens, output_tokens)

    def usage(self, now: float) -> Usage:
        """What the window ending at `now` holds."""
        self._prune(now)
        return Usage(self._requests, self._input, self._output)

    def _add_totals(self, requests: int, input_tokens: int, output_tokens: int) -> None:
        self._requests += requests
        self._input += input_tokens
        self._output += output_tokens

    def _prune(self, now: float) -> None:
        cutoff = now - self.window_s
        entries = self._entries
        while entries and entries[0].last <= cutoff:
            gone = entries.popleft()
            gone.held = False
            self._add_totals(-gone.requests, -gone.input_tokens, -gone.output_tokens)
