"""What one stream wants of one resource type (rule 9).

A subscription is either wildcard ("*", or legacy: a Listener/Cluster stream
that never named a resource), explicit names, or both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

WILDCARD = "*"


@dataclass(frozen=True)
class Change:
    """What a request changed: names newly wanted, names no longer wanted."""

    added: frozenset[str] = frozenset()
    #: Names the client asked to be sent now (rule 10): in SotW the added
    #: names; in delta every name in resource_names_subscribe, even known ones.
    requested: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()
    wildcard_added: bool = False
    wildcard_removed: bool = False

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.wildcard_added or self.wildcard_removed)


@dataclass
class Subscription:
    """Rule 9: wildcard vs explicit interest of one stream in one type."""

    wildcard: bool = False
    names: set[str] = field(default_factory=set)
    #: True once any request named a resource: the legacy wildcard is then gone.
    ever_named: bool = False

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names

    def set_sotw(self, names: Iterable[str], legacy_wildcard: bool) -> Change:
        """Rule 9 (SotW): each request carries the whole list.

        An empty list means wildcard only while the stream never named a
        resource (and only for types that allow a legacy wildcard); after
        that it unsubscribes from everything.
        """
        requested = set(names)
        if requested:
            self.ever_named = True
        wildcard = WILDCARD in requested or (
            not requested and not self.ever_named and legacy_wildcard
        )
        requested.discard(WILDCARD)
        change = Change(
            added=frozenset(requested - self.names),
            requested=frozenset(requested - self.names),
            removed=frozenset(self.names - requested),
            wildcard_added=wildcard and not self.wildcard,
            wildcard_removed=self.wildcard and not wildcard,
        )
        self.wildcard = wildcard
        self.names = requested
        return change

    def apply_delta(
        self, subscribe: Iterable[str], unsubscribe: Iterable[str], first: bool,
        legacy_wildcard: bool,
    ) -> Change:  # fmt: skip
        """Rule 9 (delta): requests carry additions and removals.

        The legacy wildcard starts with a first request that names nothing;
        it then lasts until "*" is unsubscribed.
        """
        sub, unsub = set(subscribe), set(unsubscribe)
        wildcard = self.wildcard
        if first and not sub and not unsub and legacy_wildcard:
            wildcard = True
        if WILDCARD in sub:
            wildcard = True
        if WILDCARD in unsub:
            wildcard = False
        sub.discard(WILDCARD)
        unsub.discard(WILDCARD)
        if sub:
            self.ever_named = True
        # A name in both lists: the later intent (subscribe) is unknowable; keep it.
        unsub -= sub
        added = sub - self.names
        removed = unsub & self.names
        change = Change(
            added=frozenset(added),
            requested=frozenset(sub),
            removed=frozenset(removed),
            wildcard_added=wildcard and not self.wildcard,
            wildcard_removed=self.wildcard and not wildcard,
        )
        self.wildcard = wildcard
        self.names = (self.names | added) - removed
        return change
