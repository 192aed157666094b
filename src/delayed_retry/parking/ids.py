"""Which parked messages the ids an operator typed mean: whole ids or their start. Pure.

Record ids are long (UUIDs, ``sha256:…``), so people type the start of one.
Feed every record of a parking lot to an :class:`IdMatcher` and read one
:class:`IdMatch` per id typed: a whole id selects the records with exactly
that id, otherwise the ones whose id starts with it. Either may select
several messages: two parked messages can share a ``message_id`` (a
duplicate publish, a message parked, replayed and parked again). Callers
must not act on "the first": show the candidates (:func:`describe_candidate`
says what tells them apart) or say how many an action will touch.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from delayed_retry.errors import ConfigurationError
from delayed_retry.parking.records import ParkedRecord

__all__ = ["IdMatch", "IdMatcher", "describe_candidate", "selected_count"]


@dataclass(frozen=True, kw_only=True)
class IdMatch:
    """What one id (or start of an id) the operator typed selects in a parking lot."""

    given: str
    exact: bool
    """Whether some record has exactly this id (then only those are selected)."""
    counts: Mapping[str, int]
    """How many parked messages have each record id it selects."""
    records: tuple[ParkedRecord, ...]
    """The first selected records, in queue order (at most the matcher's ``keep``)."""

    @property
    def ids(self) -> frozenset[str]:
        """The distinct record ids it selects: act on these, with ``ParkedFilter(ids=...)``."""
        return frozenset(self.counts)

    @property
    def count(self) -> int:
        """How many parked messages it selects."""
        return sum(self.counts.values())

    @property
    def found(self) -> bool:
        """Whether it selects any parked message."""
        return self.count > 0

    @property
    def ambiguous(self) -> bool:
        """Whether it selects more than one parked message (same id or several ids)."""
        return self.count > 1


@dataclass
class _Tally:
    counts: Counter[str] = field(default_factory=Counter)
    records: list[ParkedRecord] = field(default_factory=list)

    def add(self, record: ParkedRecord, keep: int) -> None:
        self.counts[record.id] += 1
        if len(self.records) < keep:
            self.records.append(record)


class IdMatcher:
    """Collects, record by record, what each typed id selects; ask :meth:`matches` at the end.

    Use it over one read of the parking lot (each read counts as a delivery
    of every message looked at). ``keep`` bounds the records kept per id, so
    a short prefix over a large lot keeps counts, not bodies.
    """

    def __init__(self, given: Iterable[str], *, keep: int = 10) -> None:
        self._given = tuple(dict.fromkeys(given))
        for text in self._given:
            if not text.strip():
                raise ConfigurationError(
                    "an empty id selects nothing; give a record id or its start, as "
                    "'parking list' shows them"
                )
        self._keep = keep
        self._exact = {g: _Tally() for g in self._given}
        self._prefix = {g: _Tally() for g in self._given}

    def add(self, record: ParkedRecord) -> None:
        """Look at one record (in queue order)."""
        for given in self._given:
            if record.id == given:
                self._exact[given].add(record, self._keep)
            elif record.id.startswith(given):
                self._prefix[given].add(record, self._keep)

    def matches(self) -> tuple[IdMatch, ...]:
        """One :class:`IdMatch` per id given, in the order given."""
        out = []
        for given in self._given:
            exact = self._exact[given]
            tally = exact if exact.counts else self._prefix[given]
            out.append(
                IdMatch(
                    given=given,
                    exact=bool(exact.counts),
                    counts=dict(tally.counts),
                    records=tuple(tally.records),
                )
            )
        return tuple(out)


def selected_count(matches: Iterable[IdMatch]) -> int:
    """How many parked messages the ids select together (one selected twice counts once)."""
    counts: dict[str, int] = {}
    for match in matches:
        counts.update(match.counts)
    return sum(counts.values())


def describe_candidate(record: ParkedRecord) -> str:
    """One record among several an id selects, with what tells it apart from the others.

    The id, when it was parked, why, and the start of its body's digest (two
    copies of one message have the same digest; a re-used id does not).
    """
    parked = (
        "parked at an unknown time"
        if record.parked_at is None
        else (f"parked {record.parked_at.isoformat(timespec='seconds')}")
    )
    failure = record.reason
    if record.exception_type:
        failure += f" {record.exception_type.rsplit('.', 1)[-1]}"
    digest = hashlib.sha256(record.body).hexdigest()[:12]
    return f"{record.id} ({parked}, {failure}, body sha256:{digest})"
