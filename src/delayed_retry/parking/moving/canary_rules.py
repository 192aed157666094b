"""A replay's canaries, the rules (pure): which copies are canaries (:class:`CanarySlots`), how
long they are watched (:class:`CanaryWait`, derived from their parking records) and what the
operator is told (:class:`CanaryNews`). The watching itself is
:mod:`delayed_retry.parking.moving.canary`.

Use :meth:`CanaryWait.choose` wherever a replay decides its canary wait (the library, the
command line, the web view), so all say the same. Why twice the retry span plus 5 s:
docs/parking.md, "The library".
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from delayed_retry.durations import format_duration
from delayed_retry.headers.names import X_LAST_FAILURE_AT
from delayed_retry.headers.retry_state import read_epoch_ms
from delayed_retry.parking.records import ParkedRecord

__all__ = [
    "HANDLING_MARGIN",
    "NO_RECORD_WAIT",
    "SPAN_FACTOR",
    "CanaryNews",
    "CanaryPhase",
    "CanarySlots",
    "CanaryWait",
    "derived_wait",
    "retry_span",
]

SPAN_FACTOR = 2.0
"""The derived wait covers the record's retry span this many times over."""
HANDLING_MARGIN = 5.0
"""Seconds added for handling the copy once it is due (and the only wait for span 0)."""
NO_RECORD_WAIT = 60.0
"""Seconds watched for a canary whose record has no failure times."""


def retry_span(record: ParkedRecord) -> float | None:
    """Seconds from the record's first failure to its last (its parking); ``None``: unknown."""
    first = record.first_failure_at
    last: datetime | None = read_epoch_ms(record.headers.get(X_LAST_FAILURE_AT))
    last = last or record.parked_at
    if first is None or last is None:
        return None
    return max((last - first).total_seconds(), 0.0)


def derived_wait(spans: Iterable[float | None]) -> float:
    """The canary wait the records call for: ``2 × span + 5 s`` of the slowest, in seconds."""
    waits = [
        NO_RECORD_WAIT if span is None else SPAN_FACTOR * span + HANDLING_MARGIN for span in spans
    ]
    return max(waits, default=HANDLING_MARGIN)


@dataclass(frozen=True, kw_only=True)
class CanaryWait:
    """The canary wait in force (``seconds``), the one the records call for, and the given one.

    ``seconds`` is how long after the canaries are due the rest is held back;
    the canaries stay watched until ``derived`` has passed too (see
    :func:`~delayed_retry.parking.moving.engine.move`).
    """

    seconds: float
    derived: float
    given: float | None = None
    span: float | None = None
    """The slowest canary's retry span (``None`` when no record said)."""

    @classmethod
    def choose(cls, spans: Iterable[float | None], *, given: float | None) -> CanaryWait:
        """The operator's wait when given, else the derived one; both kept for the warning."""
        spans = list(spans)
        known = [s for s in spans if s is not None]
        derived = derived_wait(spans)
        return cls(
            seconds=derived if given is None else given,
            derived=derived,
            given=given,
            span=max(known) if known else None,
        )

    @property
    def short(self) -> bool:
        """Whether the operator's wait is shorter than the records call for."""
        return self.given is not None and self.given < self.derived

    def rule(self) -> str:
        """Where the derived wait comes from, in words."""
        if self.span is None:
            return (
                f"{format_duration(self.derived)}: the canary's record has no failure times, "
                f"so {format_duration(NO_RECORD_WAIT)}"
            )
        return (
            f"{format_duration(self.derived)}: twice the canary's retry span of "
            f"{format_duration(self.span)} (first to last failure) plus "
            f"{format_duration(HANDLING_MARGIN)}"
        )

    def describe(self) -> str:
        """The wait in force and why, for a progress line or a confirmation."""
        if self.given is None:
            return self.rule()
        return f"{format_duration(self.seconds)} as given (the records call for {self.rule()})"

    def warning(self) -> str | None:
        """What a too-short given wait risks and how to fix it, or ``None`` when it is not short."""
        if not self.short:
            return None
        return (
            f"canary wait {format_duration(self.seconds)} is shorter than the "
            f"{self.rule()}; the rest will be replayed before a canary still retrying can park "
            f"again (it is still watched until {format_duration(self.derived)} have passed). "
            "Leave the wait out to use the derived one"
        )


CanaryPhase = Literal[
    "watching", "passed", "confirming", "confirmed", "parked-again", "parked-again-after-the-rest"
]
"""Where a replay's canaries are: watched before the rest (``watching``), quiet long enough
for the rest to follow (``passed``), watched after the rest (``confirming``), and the end:
``confirmed``, ``parked-again`` (the rest stayed parked) or ``parked-again-after-the-rest``."""


@dataclass(frozen=True, kw_only=True)
class CanaryNews:
    """What a replay's canaries are doing, told to the replay's ``canary_news`` callback."""

    phase: CanaryPhase
    ids: tuple[str, ...]
    wait: CanaryWait
    until: datetime | None = None
    """When the current watch ends (``watching``, ``confirming``)."""
    rest: int = 0
    """Messages replayed after the canaries so far."""


@dataclass(kw_only=True)
class CanarySlots:
    """The first ``size`` messages of a replay: their copies carry ``token``.

    A copy that parks again still carries it, which is how a replay knows its
    canaries failed. Ask :meth:`take` for each message replayed, in order.
    """

    size: int
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    ids: list[str] = field(default_factory=list)
    """The ids of the messages sent as canaries, in order."""
    spans: list[float | None] = field(default_factory=list)
    """Their retry spans (:func:`retry_span`): what the
    canary wait is derived from."""

    def take(self, record: ParkedRecord) -> str | None:
        """The token for this message's copy if it is a canary, else ``None``."""
        if len(self.ids) >= self.size:
            return None
        self.ids.append(record.id)
        self.spans.append(retry_span(record))
        return self.token

    @property
    def all_out(self) -> bool:
        """Every canary is sent: time to see whether they park again."""
        return len(self.ids) == self.size

    @property
    def some_out(self) -> bool:
        """Some canaries were sent but fewer than ``size`` (the selection was smaller)."""
        return 0 < len(self.ids) < self.size
