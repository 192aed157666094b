"""Storm control: parked-message arrivals grouped into one alert per window. Pure.

When a dependency goes down, hundreds of messages may park within seconds;
one alert with counts per queue and exception type, naming the first few
message ids, is what a person on call can act on. Arrivals are grouped by
queue and failure fingerprint (:mod:`delayed_retry.parking.fingerprint`: exception
type, raising frame, message template), the same key the parking-lot
commands, the web view and the Spark report use. The first arrival opens a
window of ``window`` seconds; everything arriving until it closes (or until
``max_batch`` arrivals) becomes one :class:`Alert`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from delayed_retry.chain.routing_keys import decode_routing_key
from delayed_retry.headers.names import (
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TRACEBACK,
    X_EXCEPTION_TYPE,
    X_PARKED_AT,
    X_PARKED_REASON,
    X_QUEUE,
    X_THROTTLE_EVENT,
    X_THROTTLE_TRIGGER,
)
from delayed_retry.headers.retry_state import read_epoch_ms
from delayed_retry.headers.text import header_text
from delayed_retry.parking.fingerprint import Fingerprint, fingerprint, raising_frame

__all__ = ["Alert", "AlertGroup", "AlertWindow", "ParkedArrival", "arrival_from", "group_arrivals"]

T = TypeVar("T")

UNROUTABLE = "unroutable"
"""Reason and exception type of a message the chain could not deliver (its queue is gone)."""


@dataclass(frozen=True, kw_only=True)
class ParkedArrival:
    """What an alert needs to know of one parked (or unroutable) message."""

    message_id: str | None
    queue: str
    exception_type: str
    reason: str
    exception_message: str | None = None
    parked_at: datetime | None = None
    frame: str | None = None
    """The raising frame (``path in function``), read from the parking record's traceback."""
    event: str | None = None
    """Not a parked message but a consumer's throttle event, in words (see
    :mod:`delayed_retry.consumer.throttle`); alerted on, never counted as parked."""

    @property
    def fingerprint(self) -> Fingerprint:
        """The failure fingerprint this arrival is grouped by."""
        return fingerprint(
            exception_type=self.exception_type, message=self.exception_message, frame=self.frame
        )


def arrival_from(
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None,
    routing_key: str,
    levels: int | None = None,
) -> ParkedArrival:
    """Read a message from the alert queue: a parking record, or an unroutable chain message.

    ``levels`` (the topology's) lets an unroutable chain message's routing
    key be read back into its destination queue.
    """
    headers = headers or {}
    throttle_event = header_text(headers.get(X_THROTTLE_EVENT))
    if throttle_event is not None:
        return _throttle_arrival(headers, throttle_event, message_id=message_id)
    reason = header_text(headers.get(X_PARKED_REASON))
    queue = header_text(headers.get(X_QUEUE))
    parked_ms = headers.get(X_PARKED_AT)
    parked_at = read_epoch_ms(parked_ms)
    if reason is None:
        # Came through the unroutable exchange: the chain's routing key ends in the queue name.
        if queue is None and levels is not None:
            try:
                queue = decode_routing_key(routing_key, levels).destination
            except ValueError:
                queue = None
        return ParkedArrival(
            message_id=message_id,
            queue=queue or routing_key or "?",
            exception_type=UNROUTABLE,
            reason=UNROUTABLE,
        )
    return ParkedArrival(
        message_id=message_id,
        queue=queue or routing_key or "?",
        exception_type=header_text(headers.get(X_EXCEPTION_TYPE)) or "unknown",
        reason=reason,
        exception_message=header_text(headers.get(X_EXCEPTION_MESSAGE)),
        parked_at=parked_at,
        frame=raising_frame(header_text(headers.get(X_EXCEPTION_TRACEBACK))),
    )


def _throttle_arrival(
    headers: Mapping[str, Any], event: str, *, message_id: str | None
) -> ParkedArrival:
    """A consumer's throttle tripped or resumed: one line for the alert."""
    queue = header_text(headers.get(X_QUEUE)) or "?"
    exception_type = header_text(headers.get(X_EXCEPTION_TYPE)) or "-"
    if event == "tripped":
        trigger = header_text(headers.get(X_THROTTLE_TRIGGER)) or "a run of failures"
        error = header_text(headers.get(X_EXCEPTION_MESSAGE))
        last = f"{exception_type}: {error}" if error else exception_type
        words = f"consumer of {queue} throttled after {trigger} (last: {last[:200]})"
    else:
        words = f"consumer of {queue} resumed full speed after a successful probe"
    return ParkedArrival(
        message_id=message_id,
        queue=queue,
        exception_type=exception_type,
        reason=f"throttle-{event}",
        event=words,
    )


@dataclass(frozen=True, kw_only=True)
class AlertGroup:
    """Arrivals of one queue that failed the same way (one failure fingerprint)."""

    queue: str
    exception_type: str
    count: int
    example: str | None = None
    key: str | None = None
    """The :class:`~delayed_retry.parking.fingerprint.Fingerprint` key of the group."""
    template: str | None = None
    """The message template of the group (variable parts replaced by placeholders)."""


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alert for a window of arrivals: totals, groups and the first few message ids."""

    total: int
    groups: tuple[AlertGroup, ...]
    message_ids: tuple[str, ...]
    first_parked_at: datetime | None = None
    last_parked_at: datetime | None = None
    events: tuple[str, ...] = ()
    """Throttle events of consumers in the window (trips and resumes), oldest first."""

    @property
    def more(self) -> int:
        """Arrivals not named in :attr:`message_ids`."""
        return self.total - len(self.message_ids)

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues concerned, most affected first."""
        counts: Counter[str] = Counter()
        for group in self.groups:
            counts[group.queue] += group.count
        return tuple(q for q, _ in counts.most_common())

    def title(self) -> str:
        """One line: how many messages, which queues."""
        noun = "message" if self.total == 1 else "messages"
        parked = f"{self.total} {noun} parked on {', '.join(self.queues)}"
        if not self.events:
            return parked
        more = f" (and {len(self.events) - 1} more throttle events)" if self.events[1:] else ""
        throttled = f"{self.events[-1]}{more}"
        return f"{parked}; {throttled}" if self.total else throttled

    def text(self) -> str:
        """A few lines for a person: counts per queue and exception, ids, how to list the rest."""
        lines = [self.title()]
        lines.extend(f"  throttle: {event}" for event in self.events)
        for group in self.groups:
            line = f"  {group.queue}: {group.count} × {group.exception_type}"
            if group.example:
                line += f" ({group.example[:200]})"
            lines.append(line)
        if self.message_ids:
            lines.append("message ids: " + ", ".join(self.message_ids))
        if self.more > 0:
            lines.append(f"… and {self.more} more.")
        listing = "; ".join(
            f"delayed-retry parking list --queue {q}" for q in self.queues if q != UNROUTABLE
        )
        if listing:
            lines.append(f"List them with: {listing}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The webhook payload (JSON-serialisable)."""
        return {
            "title": self.title(),
            "text": self.text(),
            "total": self.total,
            "groups": [
                {
                    "queue": g.queue,
                    "exception_type": g.exception_type,
                    "count": g.count,
                    "example": g.example,
                    "key": g.key,
                    "template": g.template,
                }
                for g in self.groups
            ],
            "message_ids": list(self.message_ids),
            "events": list(self.events),
            "more": self.more,
            "first_parked_at": self.first_parked_at.isoformat() if self.first_parked_at else None,
            "last_parked_at": self.last_parked_at.isoformat() if self.last_parked_at else None,
        }

    def to_slack(self) -> dict[str, Any]:
        """A Slack incoming-webhook payload (``text`` plus a section block)."""
        return {
            "text": self.title(),
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": f"```{self.text()}```"}}
            ],
        }


def group_arrivals(arrivals: Iterable[ParkedArrival], *, max_ids: int = 5) -> Alert:
    """One :class:`Alert` for ``arrivals``: groups by (queue, failure fingerprint), biggest first.

    Messages that differ only in values (``order 105`` / ``order 106``) fall
    in one group; its ``example`` is the first real message of the group.
    """
    items = list(arrivals)
    events = tuple(a.event for a in items if a.event is not None)
    items = [a for a in items if a.event is None]
    counts: Counter[tuple[str, str]] = Counter()
    prints: dict[tuple[str, str], Fingerprint] = {}
    examples: dict[tuple[str, str], str] = {}
    for a in items:
        fp = a.fingerprint
        group = (a.queue, fp.key)
        counts[group] += 1
        prints.setdefault(group, fp)
        if a.exception_message:
            examples.setdefault(group, a.exception_message)
    groups = tuple(
        AlertGroup(
            queue=q,
            exception_type=prints[(q, k)].exception_type,
            count=n,
            example=examples.get((q, k)),
            key=k,
            template=prints[(q, k)].template or None,
        )
        for (q, k), n in sorted(
            counts.items(),
            key=lambda kv: (-kv[1], kv[0][0], prints[kv[0]].exception_type, kv[0][1]),
        )
    )
    ids = tuple(a.message_id for a in items if a.message_id)[: max(max_ids, 0)]
    times = [a.parked_at for a in items if a.parked_at is not None]
    return Alert(
        total=len(items),
        groups=groups,
        message_ids=ids,
        first_parked_at=min(times) if times else None,
        last_parked_at=max(times) if times else None,
        events=events,
    )


class AlertWindow(Generic[T]):
    """Collects arrivals (each with a token, e.g. the message to ack) until the window closes.

    ``now`` values come from the caller's clock (``time.monotonic`` in
    :class:`~delayed_retry.alerts.ParkingAlerts`), so the logic is tested
    with a controllable one. ``window=0`` alerts on each arrival batch as it
    comes.
    """

    def __init__(self, *, window: float, max_ids: int = 5, max_batch: int = 1000) -> None:
        if window < 0:
            raise ValueError(f"AlertWindow window={window!r} must be at least 0 seconds")
        if max_batch < 1:
            raise ValueError(f"AlertWindow max_batch={max_batch!r} must be at least 1")
        self.window = window
        self.max_ids = max_ids
        self.max_batch = max_batch
        self._items: list[tuple[ParkedArrival, T]] = []
        self._opened_at: float | None = None

    def __len__(self) -> int:
        return len(self._items)

    def add(self, arrival: ParkedArrival, token: T, *, now: float) -> None:
        """Add one arrival; the first one opens the window."""
        if self._opened_at is None:
            self._opened_at = now
        self._items.append((arrival, token))

    def deadline(self) -> float | None:
        """When the open window closes, or ``None`` when nothing waits."""
        return None if self._opened_at is None else self._opened_at + self.window

    def ready(self, *, now: float) -> bool:
        """True when the window has closed or is full."""
        deadline = self.deadline()
        if deadline is None:
            return False
        return now >= deadline or len(self._items) >= self.max_batch

    def take(self) -> tuple[Alert, list[T]] | None:
        """Close the window: the alert for up to ``max_batch`` arrivals and their tokens.

        Arrivals past ``max_batch`` stay and open the next window at once.
        """
        if not self._items:
            return None
        batch, self._items = self._items[: self.max_batch], self._items[self.max_batch :]
        if not self._items:
            self._opened_at = None
        alert = group_arrivals((a for a, _ in batch), max_ids=self.max_ids)
        return alert, [token for _, token in batch]
