"""A message waiting in the delay chain, read from its level queue, and which ones a discard
selects. Pure: :mod:`~delayed_retry.admin.chain_discard` does the reading and the acting.

A waiting message is a retry copy or a message scheduled with ``publish_delayed`` /
``delayed-retry publish --delay``. Its chain routing key names the queue it is due to
reach (a forward queue for a message scheduled to an exchange) and its ``x-retry-due-at``
header the moment it is due. Its id is the one parked messages have: its ``message_id``,
or ``sha256:`` and the start of its body's digest when it has none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from delayed_retry.chain import routing_keys
from delayed_retry.chain.topology import QueueType
from delayed_retry.durations import to_epoch_ms
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers import (
    X_DELIVERY_COUNT,
    X_DUE_AT,
    X_PARKED_AT,
    X_PARKED_NOTE,
    X_PARKED_REASON,
    X_QUEUE,
    header_int,
    read_epoch_ms,
    sanitize_headers,
)
from delayed_retry.parking.records import record_id

__all__ = [
    "DISCARDED",
    "READ_BUDGET",
    "WaitingMessage",
    "WaitingSelection",
    "discarded_headers",
    "expedited_headers",
    "over_read_budget",
    "read_waiting",
    "reads_are_counted",
]

DISCARDED = "discarded"
"""The parking reason of a message an operator took out of the chain with ``--park``."""

READ_BUDGET = 10
"""Returns a waiting message may already have had before a discard stops reading its level.

RabbitMQ 4.0-4.2 count every return of a quorum queue message toward a
delivery limit of 20 (level queues carry none of their own), and on the 21st
return dead-letter it to the next level: early. A discard returns each
message it leaves once, so a message already returned this many times stops
the scan, well before the limit (RabbitMQ 4.3 counts a ``basic.nack``, the
way a discard returns, as no delivery; there the count only grows when a
discard is cut off and its channel closes)."""


@dataclass(frozen=True, kw_only=True)
class WaitingMessage:
    """One message waiting in a level queue: who it is, where and when it is due."""

    id: str
    """Its ``message_id``, or ``sha256:`` and the start of its body's digest."""
    message_id: str | None
    destination: str | None
    """The queue it is due to reach (``None``: a routing key the chain did not write)."""
    level: int
    due_at: datetime | None
    """When it is due (``None``: another producer's message, without a due time)."""
    returns: int
    """How often the broker says it was returned (``x-delivery-count``; 0 when absent)."""


def read_waiting(
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None,
    body: bytes,
    routing_key: str,
    level: int,
    levels: int,
) -> WaitingMessage:
    """The :class:`WaitingMessage` a level queue delivered; never raises on odd headers."""
    h: Mapping[str, Any] = headers if isinstance(headers, Mapping) else {}
    try:
        destination: str | None = routing_keys.decode_routing_key(routing_key, levels).destination
    except ValueError:
        destination = None
    count = h.get(X_DELIVERY_COUNT)
    returns = header_int(count) or 0
    return WaitingMessage(
        id=record_id(message_id, body),
        message_id=message_id,
        destination=destination,
        level=level,
        due_at=read_epoch_ms(h.get(X_DUE_AT)),
        returns=returns,
    )


@dataclass(frozen=True, kw_only=True)
class WaitingSelection:
    """Which waiting messages a discard takes: these ids, and/or those due to this queue.

    An id selects the messages whose id or ``message_id`` is exactly it (two
    waiting messages may share one: every copy goes). With ``queue`` alone,
    every message waiting for that queue is selected. An empty selection is
    refused: removing every waiting message is ``delayed-retry teardown
    --discard-waiting``'s job.
    """

    ids: frozenset[str] = frozenset()
    queue: str | None = None

    def __post_init__(self) -> None:
        if not self.ids and not self.queue:
            raise ConfigurationError(
                "a discard needs a selection: ids of waiting messages, a destination queue, or "
                "both ('delayed-retry topology discard --dry-run --queue QUEUE' lists what waits "
                "for QUEUE); to remove every waiting message, tear the chain down with "
                "'delayed-retry teardown --discard-waiting'"
            )
        for given in self.ids:
            if not given.strip():
                raise ConfigurationError(
                    "an empty id selects nothing; give a waiting message's whole id, as "
                    "'delayed-retry topology discard --dry-run --queue QUEUE' lists them"
                )

    def matches(self, message: WaitingMessage) -> bool:
        """Whether ``message`` is selected."""
        if self.queue is not None and message.destination != self.queue:
            return False
        return not self.ids or message.id in self.ids or message.message_id in self.ids

    def unmatched(self, found: Iterable[WaitingMessage]) -> tuple[str, ...]:
        """The ids given that selected none of ``found``, in sorted order."""
        seen = set()
        for message in found:
            seen.add(message.id)
            if message.message_id is not None:
                seen.add(message.message_id)
        return tuple(sorted(self.ids - seen))


def reads_are_counted(*, broker_major: int | None, queue_type: QueueType) -> bool:
    """Whether a return from a level queue may count toward the broker's delivery limit.

    Quorum queues on RabbitMQ 4.x (and on a broker that does not say its
    version): see :data:`READ_BUDGET`. Classic queues and RabbitMQ 3.x
    quorum queues without a delivery limit never drop or move a message for
    its returns.
    """
    return queue_type == "quorum" and (broker_major is None or broker_major >= 4)


def over_read_budget(message: WaitingMessage, *, counted: bool) -> bool:
    """Whether reading ``message`` again could bring it close to its level's delivery limit."""
    return counted and message.returns >= READ_BUDGET


def expedited_headers(headers: Mapping[str, Any] | None, *, now: datetime) -> dict[str, Any]:
    """The headers of a waiting message sent on at once: due ``now``, retry state unchanged.

    The broker-written headers go (see :func:`~delayed_retry.headers.sanitize_headers`); the
    retry count, first failure and last error stay, so the consumer sees the same attempt.
    """
    out = sanitize_headers(headers)
    if X_DUE_AT in out:
        out[X_DUE_AT] = to_epoch_ms(now)  # the consumer would otherwise hold it until then
    return out


def discarded_headers(
    headers: Mapping[str, Any] | None, *, destination: str, now: datetime
) -> dict[str, Any]:
    """The parking record of a discarded message: reason ``discarded``, for ``parking replay``.

    The broker-written headers go (see :func:`~delayed_retry.headers.sanitize_headers`)
    and so does the due time, as in every parking record; the note says when it was due.
    ``x-retry-queue`` names the destination, so a replay sends it back there.
    """
    out = sanitize_headers(headers)
    due_at = read_epoch_ms(out.pop(X_DUE_AT, None))
    out[X_PARKED_REASON] = DISCARDED
    out[X_PARKED_AT] = to_epoch_ms(now)
    out[X_QUEUE] = destination
    due = "at an unknown time" if due_at is None else f"at {due_at.isoformat(timespec='seconds')}"
    out[X_PARKED_NOTE] = f"discarded from the delay chain by an operator; it was due {due}"
    return out
