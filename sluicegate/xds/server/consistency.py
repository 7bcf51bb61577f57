"""Is a snapshot whole? Every resource a published resource needs over ADS must be in it.

Like go-control-plane's `Snapshot.Consistent`, but only missing resources count:
one that nothing names is harmless (tests publish EDS-only snapshots), while a
missing one leaves Envoy waiting for it (a cluster warming forever, a listener
without routes). See docs/xds-rules.md, rule 14.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.xds.resource import REFERRING_TYPES, References, references
from sluicegate.xds.server.snapshot import Snapshot

#: A few are enough to find the bug; a broken translator could miss thousands.
_SHOWN = 5


@dataclass(frozen=True, order=True)
class MissingReference:
    """`needed_by` (a `needed_by_type`) names `name` (a `type_url`), which the snapshot lacks."""

    type_url: str
    name: str
    needed_by_type: str
    needed_by: str

    def __str__(self) -> str:
        return (
            f"{_short(self.needed_by_type)} {self.needed_by!r} needs "
            f"{_short(self.type_url)} {self.name!r}"
        )


class InconsistentSnapshot(ValueError):
    """A snapshot lacks resources that others in it need; it was not published."""

    def __init__(self, missing: Sequence[MissingReference]) -> None:
        self.missing = tuple(missing)
        shown = "; ".join(str(m) for m in self.missing[:_SHOWN])
        more = len(self.missing) - _SHOWN
        suffix = f" (and {more} more)" if more > 0 else ""
        super().__init__(f"inconsistent snapshot, not published: {shown}{suffix}")


class ConsistencyCheck:
    """Finds what a snapshot lacks, walking only resources it has not seen before.

    It remembers what the last checked snapshot's resources name, by content
    version, so a reload that changed a few clusters of a thousand walks those few.
    """

    def __init__(self) -> None:
        self._named: dict[tuple[str, str], References] = {}

    def missing(self, snapshot: Snapshot) -> list[MissingReference]:
        """What resources of `snapshot` need and it lacks, sorted; empty when consistent.

        xDS spec, "eventual consistency considerations": Envoy waits for every
        resource another names (a cluster stays warming without its endpoints),
        so a snapshot must hold them all.
        """
        named: dict[tuple[str, str], References] = {}
        any_memo: dict[bytes, References] = {}
        missing: list[MissingReference] = []
        for type_url in REFERRING_TYPES & snapshot.type_urls():
            for name, entry in snapshot.resources(type_url).items():
                key = (type_url, entry.version)
                refs = self._named.get(key)
                if refs is None:
                    refs = references(type_url, entry.message, any_memo)
                named[key] = refs
                for wanted_type, names in refs.items():
                    have = snapshot.resources(wanted_type)
                    missing.extend(
                        MissingReference(wanted_type, wanted, type_url, name)
                        for wanted in names
                        if wanted not in have
                    )
        self._named = named
        return sorted(missing)


def missing_references(snapshot: Snapshot) -> list[MissingReference]:
    """`ConsistencyCheck().missing(snapshot)`: for a caller that checks before publishing."""
    return ConsistencyCheck().missing(snapshot)


def _short(type_url: str) -> str:
    return type_url.rsplit(".", 1)[-1]
