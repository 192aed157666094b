"""Every header name the library reads or writes, and which of them the broker owns.

The names on the wire are fixed: messages waiting in a chain carry them, so
a name here never changes. The library keeps its own state in its own headers
(:data:`X_RETRY` and the ``x-retry-*`` family); the broker's (:data:`BROKER_HEADERS`,
``x-first-death-*``, ``x-last-death-*``) are read, never re-published.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "X_RETRY",
    "X_DUE_AT",
    "X_FIRST_FAILURE_AT",
    "X_LAST_FAILURE_AT",
    "X_LAST_ERROR",
    "X_ORIGINAL_EXCHANGE",
    "X_ORIGINAL_ROUTING_KEY",
    "X_QUEUE",
    "X_PARKED_REASON",
    "X_PARKED_AT",
    "X_PARKED_REFRESHED_AT",
    "X_EXCEPTION_TYPE",
    "X_EXCEPTION_MESSAGE",
    "X_EXCEPTION_TRACEBACK",
    "X_REPLAYED",
    "X_REPLAYED_AT",
    "X_REPLAYED_BY",
    "X_REPLAY_CANARY",
    "X_DELAY",
    "X_FORWARD_ROUTING_KEY",
    "X_CLAIMED_QUEUE",
    "X_TRACE_ORIGIN",
    "X_REDRIVE_ID",
    "X_SCHEDULE_ID",
    "X_PARKED_NOTE",
    "X_HEADER_PROBLEMS",
    "X_MIGRATED_FROM",
    "X_IMMEDIATE_RUNS",
    "X_RETRY_CRASHES",
    "X_THROTTLE_EVENT",
    "X_THROTTLE_TRIGGER",
    "X_THROTTLED_AT",
    "X_EDITED_AT",
    "X_EDITED_BY",
    "X_ORDER_KEY",
    "X_ORDER_TOKEN",
    "X_ORDER_SEQ",
    "X_ORDER_RECORD",
    "X_EDITED_HEADERS",
    "X_EDITED_OLD_BODY_SHA256",
    "X_DEATH",
    "X_DELIVERY_COUNT",
    "X_ACQUIRED_COUNT",
    "BROKER_HEADERS",
    "BROKER_READ_COUNTERS",
    "is_broker_header",
    "owned_header_reason",
    "split_read_counters",
]

X_RETRY = "x-retry"
"""Delayed retries already made (an int); the next handling is attempt ``x-retry + 1``."""
X_DUE_AT = "x-retry-due-at"
"""Absolute due time of a message in the chain, milliseconds since the Unix epoch."""
X_FIRST_FAILURE_AT = "x-retry-first-failure-at"
"""When the message first failed, milliseconds since the Unix epoch."""
X_LAST_FAILURE_AT = "x-retry-last-failure-at"
"""When the message last failed, milliseconds since the Unix epoch."""
X_LAST_ERROR = "x-retry-last-error"
"""``Type: message`` of the last failure, bounded."""
X_ORIGINAL_EXCHANGE = "x-retry-original-exchange"
"""The exchange the message was first published to (informational: never used to route)."""
X_ORIGINAL_ROUTING_KEY = "x-retry-original-routing-key"
"""The routing key the message was first published with (informational)."""
X_QUEUE = "x-retry-queue"
"""The queue the message failed in and returns to."""
X_PARKED_REASON = "x-parked-reason"
"""Why a message was parked: ``max-retries``, ``not-retryable``, ``park-requested``, …"""
X_PARKED_AT = "x-parked-at"
"""When the message was parked, milliseconds since the Unix epoch."""
X_PARKED_REFRESHED_AT = "x-parked-refreshed-at"
"""When a parked message was last moved to the tail of its parking queue (``parking
refresh``), milliseconds since the Unix epoch; ``x-parked-at`` keeps the first parking."""
X_EXCEPTION_TYPE = "x-exception-type"
"""Qualified name of the exception that parked the message."""
X_EXCEPTION_MESSAGE = "x-exception-message"
"""``str()`` of that exception, bounded."""
X_EXCEPTION_TRACEBACK = "x-exception-traceback"
"""Its traceback, bounded (the innermost frames are kept)."""

X_REPLAYED = "x-retry-replayed"
"""How many times a message has been replayed from parking (an int)."""
X_REPLAYED_AT = "x-retry-replayed-at"
"""When it was last replayed, milliseconds since the Unix epoch."""
X_REPLAYED_BY = "x-retry-replayed-by"
"""Who replayed it last, when known (the command line writes ``user@host``)."""
X_REPLAY_CANARY = "x-retry-replay-canary"
"""Token on a canary copy, so the replay can tell when it parks again."""
X_DELAY = "x-delay"
"""The plugin's header: the delay in milliseconds."""
X_FORWARD_ROUTING_KEY = "x-retry-forward-routing-key"
"""The routing key a message in a forward queue is delivered with."""
X_CLAIMED_QUEUE = "x-retry-claimed-queue"
"""On a message the router could not route: the queue its ``x-death`` named (never trusted)."""
X_TRACE_ORIGIN = "x-retry-trace-origin"
"""``traceparent`` of the delivery that first failed; later attempts link to it."""
X_REDRIVE_ID = "x-redrive-id"
"""Header naming the redrive a message was sent by."""
X_SCHEDULE_ID = "x-schedule-id"
"""Header naming the bulk schedule a message was sent by."""
X_PARKED_NOTE = "x-parked-note"
"""On a parking record: what the record could not keep (original headers that could not be
encoded)."""
X_HEADER_PROBLEMS = "x-retry-header-problems"
"""On a parking record: headers of the message that were present but unusable."""
X_MIGRATED_FROM = "x-retry-migrated-from"
"""On a message moved out of another chain: the level queue it was taken from."""
X_IMMEDIATE_RUNS = "x-retry-immediate-runs"
"""With immediate retries on: how many times the handler ran in each failed delivery, oldest
first (a list of ints; ``[3, 3]``: two deliveries, each run three times). The most recent
:data:`~delayed_retry.headers.retry_state.MAX_IMMEDIATE_HISTORY` are kept."""
X_RETRY_CRASHES = "x-retry-crashes"
"""Times a message's consumer went away while holding it (the crash guard's count, an int)."""
X_THROTTLE_EVENT = "x-retry-throttle-event"
"""On an alert-queue event: ``tripped`` or ``resumed`` (a consumer's throttle changed state)."""
X_THROTTLE_TRIGGER = "x-retry-throttle-trigger"
"""On a throttle event: the trigger in words ("5 consecutive failures")."""
X_THROTTLED_AT = "x-retry-throttled-at"
"""On a throttle event: when it happened (epoch milliseconds)."""
X_EDITED_AT = "x-edited-at"
"""On a message edited before its replay (``parking edit``): when, epoch milliseconds."""
X_EDITED_BY = "x-edited-by"
"""Who edited it, when known (``user@host`` on the command line, the user in the web view)."""
X_EDITED_HEADERS = "x-edited-headers"
"""The headers the edit set or removed, as ``set: a, b; removed: c`` (``none`` when only the
body changed)."""
X_EDITED_OLD_BODY_SHA256 = "x-edited-old-body-sha256"
"""Present when the edit replaced the body: the SHA-256 (hex) of the body it replaced."""
X_ORDER_KEY = "x-retry-order-key"
"""The key a consumer with ``ordered_by=`` keeps in order (on its retries and order records)."""
X_ORDER_TOKEN = "x-retry-order-token"
"""What identifies a message of an ordered key across retries: its id, else a digest."""
X_ORDER_SEQ = "x-retry-order-seq"
"""A record's place in its partition's order queue (an int, rising)."""
X_ORDER_RECORD = "x-retry-order-record"
"""What an order-queue record is: ``block``, ``deferred`` or ``marker``."""
X_DEATH = "x-death"
"""The broker's dead-letter history (read to count rejections, never re-published)."""
X_DELIVERY_COUNT = "x-delivery-count"
"""Quorum queues' count of returns toward the delivery limit, set by the broker on redelivery
(on 4.3 a ``nack`` no longer raises it; a ``reject`` or a closed channel does). Never
re-published."""
X_ACQUIRED_COUNT = "x-acquired-count"
"""RabbitMQ 4.3+: how many times a quorum queue message was delivered before (every return,
``nack`` included), kept through dead-lettering. Never re-published."""

BROKER_HEADERS = (X_DEATH, X_DELIVERY_COUNT, X_ACQUIRED_COUNT)
"""Broker-written headers, never re-published (nor any ``x-first-death-*``/``x-last-death-*``)."""

BROKER_READ_COUNTERS = {
    X_DELIVERY_COUNT: "times read and given back; each look counts",
    X_ACQUIRED_COUNT: "times taken from the queue; each look counts",
}
"""Counters the broker writes on a message each time it is read, with what each counts.

Reading a parking queue takes messages and gives them back, so every look
(``parking show`` included) raises them: show them apart from the headers the
sender wrote, labelled, never as the message's own (:func:`split_read_counters`)."""


def is_broker_header(name: str) -> bool:
    """Whether the broker wrote header ``name`` (dead-letter history, delivery counters).

    Such a header is dropped from every copy the library publishes: carried
    into the chain, ``x-death`` makes RabbitMQ up to 3.12 drop the message as a
    dead-letter cycle, or stalls a quorum queue.
    """
    return (
        name in BROKER_HEADERS
        or name.startswith("x-first-death-")
        or name.startswith("x-last-death-")
    )


_OWNED_PREFIXES = {
    "x-retry": "the library's retry state and replay record, rewritten by every replay",
    "x-parked-": "the parking record, dropped by the replay",
    "x-exception-": "the parking record, dropped by the replay",
    "x-edited-": "the record of the edit itself, written by the edit",
}
_OWNED_NAMES = {
    X_DELAY: "the delayed-message plugin's delay, read by the front door",
    X_REDRIVE_ID: "the redrive that sent the message, written by the Spark jobs",
    X_SCHEDULE_ID: "the bulk schedule that sent the message, written by the Spark jobs",
}


def owned_header_reason(name: str) -> str | None:
    """Why header ``name`` belongs to the library or the broker, or ``None`` when it does not.

    Use it before letting people set or remove a header by hand (an edit
    before a replay): such a header is the library's state or the broker's
    history, and changing it would falsify the record or the retry budget.
    """
    lowered = name.lower()
    if is_broker_header(lowered):
        return "the broker's dead-letter history or delivery counter, never re-published"
    if lowered in _OWNED_NAMES:
        return _OWNED_NAMES[lowered]
    for prefix, reason in _OWNED_PREFIXES.items():
        if lowered.startswith(prefix):
            return reason
    return None


def split_read_counters(
    headers: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``headers`` without the broker's read counters, and those counters apart.

    Use it wherever a parked message's headers are shown to people: the
    counters rise with every look, so they must not read as the message's.
    """
    own = {k: v for k, v in headers.items() if k not in BROKER_READ_COUNTERS}
    counters = {k: headers[k] for k in BROKER_READ_COUNTERS if k in headers}
    return own, counters
