"""What a move (replay, purge, refresh) counts and reports. Pure.

:func:`~delayed_retry.parking.moving.engine.move` does the I/O and feeds a
:class:`MoveTally`, which counts what was looked at and acted on, tells the ``progress``
callback (:class:`MoveProgress`) and ends in a :class:`MoveReport`, whose ``stopped`` and
``canary_verdict`` take the constants below. Nothing here talks to a broker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypedDict

from delayed_retry.parking.moving.canary_rules import CanaryWait
from delayed_retry.parking.records import ParkedRecord

__all__ = [
    "CANARY_CONFIRMED",
    "CANARY_PARKED_AFTER_THE_REST",
    "CANARY_PARKED_AGAIN",
    "LIMIT_REACHED",
    "MoveProgress",
    "MoveReport",
    "MoveTally",
]

MoveAction = Literal["replay", "purge", "refresh"]

LIMIT_REACHED = "limit"
"""``MoveReport.stopped`` when ``limit`` messages were selected before the end of the set."""
CANARY_PARKED_AGAIN = "canary-parked-again"
"""``MoveReport.stopped`` (and ``canary_verdict``) when a canary parked again before the rest
was replayed: the rest stayed parked."""
CANARY_PARKED_AFTER_THE_REST = "canary-parked-again-after-the-rest"
"""``MoveReport.canary_verdict`` when a canary parked again while it was watched after the
rest was replayed: the rest is probably failing too."""
CANARY_CONFIRMED = "canary-confirmed"
"""``MoveReport.canary_verdict`` when no canary parked again until its watch ended."""


class _Counts(TypedDict):
    """What :class:`MoveProgress` and :class:`MoveReport` both say of a move so far."""

    action: MoveAction
    done: int
    scanned: int
    depth: int
    dry_run: bool


@dataclass(frozen=True, kw_only=True)
class MoveProgress:
    """Where a replay or purge is, given to the ``progress`` callback after each message."""

    action: MoveAction
    done: int
    """Messages replayed, purged or refreshed so far (would be, in a dry run)."""
    scanned: int
    """Messages looked at so far."""
    depth: int
    """Messages the broker counted in the parking queue at the start: a progress total."""
    record: ParkedRecord | None
    """The record just acted on (``None`` for a skipped one)."""
    dry_run: bool


@dataclass(frozen=True, kw_only=True)
class MoveReport:
    """What a replay, purge or refresh did (or would do, in a dry run)."""

    action: MoveAction
    done: int
    scanned: int
    depth: int
    dry_run: bool
    to_queue: str | None = None
    stopped: str | None = None
    """Why it stopped before the end, or ``None`` when it went through the whole set."""
    canary_ids: tuple[str, ...] = ()
    canary_wait: CanaryWait | None = None
    """The canary wait in force and the one the canaries' records call for."""
    canary_verdict: str | None = None
    """:data:`CANARY_CONFIRMED`, :data:`CANARY_PARKED_AGAIN` or
    :data:`CANARY_PARKED_AFTER_THE_REST`; ``None`` without canaries."""

    @property
    def canary_failed(self) -> bool:
        """Whether a canary parked again, before or after the rest was replayed."""
        return self.canary_verdict in (CANARY_PARKED_AGAIN, CANARY_PARKED_AFTER_THE_REST)


@dataclass(kw_only=True)
class MoveTally:
    """The counts of one replay or purge as it goes, and the report at its end.

    Call :meth:`looked_at` for every message taken from the parking queue and
    :meth:`acted_on` once a selected one is replayed or purged (acked); each
    skipped and each acted-on message is told to ``progress``.
    """

    action: MoveAction
    dry_run: bool
    progress: Callable[[MoveProgress], None] | None = None
    to_queue: str | None = None
    depth: int = 0
    scanned: int = 0
    selected: int = 0
    done: int = 0
    stopped: str | None = None

    def reached(self, limit: int | None) -> bool:
        """Whether ``limit`` messages are selected already (``None``: there is no limit)."""
        return limit is not None and self.selected >= limit

    def looked_at(self, *, selected: bool) -> None:
        """Count one message taken; a skipped one is told to ``progress`` at once."""
        self.scanned += 1
        if selected:
            self.selected += 1
        else:
            self._tell(None)

    def acted_on(self, record: ParkedRecord) -> None:
        """Count one message replayed or purged (or that would be, in a dry run)."""
        self.done += 1
        self._tell(record)

    def report(
        self,
        *,
        canary_ids: tuple[str, ...] = (),
        canary_wait: CanaryWait | None = None,
        canary_verdict: str | None = None,
    ) -> MoveReport:
        """The report of the operation so far."""
        return MoveReport(
            **self._counts(),
            to_queue=self.to_queue,
            stopped=self.stopped,
            canary_ids=canary_ids,
            canary_wait=canary_wait,
            canary_verdict=canary_verdict,
        )

    def _counts(self) -> _Counts:
        return {
            "action": self.action,
            "done": self.done,
            "scanned": self.scanned,
            "depth": self.depth,
            "dry_run": self.dry_run,
        }

    def _tell(self, record: ParkedRecord | None) -> None:
        if self.progress is not None:
            self.progress(MoveProgress(**self._counts(), record=record))
