"""Read and write the retry state a message carries in its headers. Pure functions.

delayed-retry keeps its own state in its own headers (:data:`X_RETRY` and the
``x-retry-*`` family) and reads the broker's ``x-death`` only to count
rejections. Before any re-publish the broker's death headers are removed:
carrying them into the delay chain makes the broker drop the message as a
dead-letter cycle (RabbitMQ ≤ 3.12) or stall a quorum queue.
"""

from __future__ import annotations

import base64
import functools
import math
import struct
import traceback as tb
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from delayed_retry.durations import from_epoch_ms, to_epoch_ms

__all__ = [
    "BROKER_HEADERS",
    "BROKER_READ_COUNTERS",
    "X_ACQUIRED_COUNT",
    "X_CLAIMED_QUEUE",
    "X_DEATH",
    "X_DELAY",
    "X_DELIVERY_COUNT",
    "X_FORWARD_ROUTING_KEY",
    "X_HEADER_PROBLEMS",
    "X_IMMEDIATE_RUNS",
    "X_MIGRATED_FROM",
    "X_PARKED_NOTE",
    "X_PARKED_REFRESHED_AT",
    "X_REDRIVE_ID",
    "X_REPLAYED",
    "X_REPLAYED_AT",
    "X_REPLAYED_BY",
    "X_REPLAY_CANARY",
    "X_RETRY_CRASHES",
    "X_SCHEDULE_ID",
    "X_THROTTLED_AT",
    "X_THROTTLE_EVENT",
    "X_THROTTLE_TRIGGER",
    "X_TRACE_ORIGIN",
    "MAX_RETRY_COUNT",
    "X_DUE_AT",
    "X_EXCEPTION_MESSAGE",
    "X_EXCEPTION_TRACEBACK",
    "X_EXCEPTION_TYPE",
    "X_FIRST_FAILURE_AT",
    "X_LAST_ERROR",
    "X_LAST_FAILURE_AT",
    "X_ORIGINAL_EXCHANGE",
    "X_ORIGINAL_ROUTING_KEY",
    "X_PARKED_AT",
    "X_PARKED_REASON",
    "X_QUEUE",
    "X_RETRY",
    "RetryState",
    "failure_headers",
    "forwarded_headers",
    "parking_headers",
    "parse_retry_state",
    "read_epoch_ms",
    "sanitize_headers",
    "scheduled_headers",
    "split_read_counters",
    "encode_body_preview",
    "exception_name",
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
:data:`MAX_IMMEDIATE_HISTORY` are kept."""
X_RETRY_CRASHES = "x-retry-crashes"
"""Times a message's consumer went away while holding it (the crash guard's count, an int)."""
X_THROTTLE_EVENT = "x-retry-throttle-event"
"""On an alert-queue event: ``tripped`` or ``resumed`` (a consumer's throttle changed state)."""
X_THROTTLE_TRIGGER = "x-retry-throttle-trigger"
"""On a throttle event: the trigger in words ("5 consecutive failures")."""
X_THROTTLED_AT = "x-retry-throttled-at"
"""On a throttle event: when it happened (epoch milliseconds)."""
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

MAX_RETRY_COUNT = 1_000_000
"""An ``x-retry`` above this is treated as malformed, not as a real count."""

MAX_IMMEDIATE_HISTORY = 100
"""Entries of :data:`X_IMMEDIATE_RUNS` kept; ``x-retry`` still counts every delivery."""
MAX_ERROR_CHARS = 2_000
MAX_TRACEBACK_CHARS = 8_000
MAX_HEADER_STRING_CHARS = 32_000
MAX_HEADER_DEPTH = 8
_COUNTED_DEATHS = ("rejected", "delivery_limit")
_QUEUE_STATE = (X_RETRY, X_FIRST_FAILURE_AT, X_LAST_FAILURE_AT, X_LAST_ERROR, X_DUE_AT)
"""Headers that count only for the queue named in :data:`X_QUEUE`."""
_STATE_HEADERS = frozenset(
    (*_QUEUE_STATE, X_QUEUE, X_ORIGINAL_EXCHANGE, X_ORIGINAL_ROUTING_KEY, X_DEATH)
)
"""Every header :func:`parse_retry_state` reads: a message with none of them is on attempt 1."""


@dataclass(frozen=True, kw_only=True)
class RetryState:
    """What a handler can know about the delivery it got.

    ``attempt`` is 1 on the first handling, 2 on the first retry, and so on.
    ``problems`` lists headers that were present but unusable (they are
    ignored, and counting starts from what could be read).
    """

    attempt: int
    retries: int
    queue: str | None
    original_exchange: str
    original_routing_key: str
    first_failure_at: datetime | None = None
    last_failure_at: datetime | None = None
    last_error: str | None = None
    due_at: datetime | None = None
    broker_deaths: int = 0
    problems: tuple[str, ...] = field(default=())
    immediate_retries: int = 0
    """Immediate retries made so far in this delivery: 0 on its first run, 1 on the next …"""


def _epoch_ms(value: object, name: str, problems: list[str]) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 47:
        return from_epoch_ms(value)
    problems.append(f"{name}={value!r:.60} is not milliseconds since the epoch; ignored")
    return None


def read_epoch_ms(value: object) -> datetime | None:
    """An epoch-milliseconds header value as an aware datetime, or ``None`` if it is not one."""
    return _epoch_ms(value, "", [])


def _text(value: object, name: str, problems: list[str]) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return _utf8(value[:MAX_HEADER_STRING_CHARS])
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")[:MAX_HEADER_STRING_CHARS]
    problems.append(f"{name} has type {type(value).__name__}, not text; ignored")
    return None


def _broker_deaths(x_death: object, queue: str | None) -> int:
    """Rejections recorded by the broker (``x-death``), for ``queue`` when it is known."""
    if not isinstance(x_death, list):
        return 0
    total = 0
    for entry in x_death:
        if not isinstance(entry, Mapping) or entry.get("reason") not in _COUNTED_DEATHS:
            continue
        if queue is not None and entry.get("queue") != queue:
            continue
        count = entry.get("count")
        if isinstance(count, int) and not isinstance(count, bool) and 0 < count <= MAX_RETRY_COUNT:
            total += count
    return min(total, MAX_RETRY_COUNT)


@functools.lru_cache(maxsize=256)
def _first_attempt(queue: str | None, exchange: str, routing_key: str) -> RetryState:
    """The state of a message that has never failed (frozen, so one object serves them all)."""
    return RetryState(
        attempt=1,
        retries=0,
        queue=queue,
        original_exchange=exchange,
        original_routing_key=routing_key,
    )


def parse_retry_state(
    headers: Mapping[str, Any] | None,
    *,
    exchange: str | None,
    routing_key: str | None,
    queue: str | None,
) -> RetryState:
    """Read the retry state from ``headers``; never raises, whatever the headers hold.

    ``exchange`` and ``routing_key`` are those of the delivery; the original
    ones come from the headers when the message has been through the chain.
    ``queue`` is the queue the consumer is bound to; ``None`` means "read it
    from the headers" (for tools, never for routing).
    """
    h: Mapping[str, Any] = headers if isinstance(headers, Mapping) else {}
    if h.keys().isdisjoint(_STATE_HEADERS):  # a first delivery: nothing to read
        return _first_attempt(queue, exchange or "", routing_key or "")
    problems: list[str] = []
    raw = h.get(X_RETRY)
    retries = 0
    if raw is not None:
        if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= MAX_RETRY_COUNT:
            retries = raw
        else:
            problems.append(
                f"{X_RETRY}={raw!r:.60} is not a count in 0..{MAX_RETRY_COUNT}; counting from 0"
            )
    header_queue = _text(h.get(X_QUEUE), X_QUEUE, problems)
    if queue is not None and header_queue is not None and header_queue != queue:
        # Written by another queue's consumer (a message forwarded with its headers
        # copied): that count and those times belong to that queue, not to this one.
        h = {k: v for k, v in h.items() if k not in _QUEUE_STATE}
        retries = 0
        problems.clear()
    deaths = _broker_deaths(h.get(X_DEATH), queue)
    retries = max(retries, deaths)
    original_exchange = _text(h.get(X_ORIGINAL_EXCHANGE), X_ORIGINAL_EXCHANGE, problems)
    original_key = _text(h.get(X_ORIGINAL_ROUTING_KEY), X_ORIGINAL_ROUTING_KEY, problems)
    return RetryState(
        attempt=retries + 1,
        retries=retries,
        queue=queue if queue is not None else header_queue,
        original_exchange=original_exchange if original_exchange is not None else (exchange or ""),
        original_routing_key=original_key if original_key is not None else (routing_key or ""),
        first_failure_at=_epoch_ms(h.get(X_FIRST_FAILURE_AT), X_FIRST_FAILURE_AT, problems),
        last_failure_at=_epoch_ms(h.get(X_LAST_FAILURE_AT), X_LAST_FAILURE_AT, problems),
        last_error=_text(h.get(X_LAST_ERROR), X_LAST_ERROR, problems),
        due_at=_epoch_ms(h.get(X_DUE_AT), X_DUE_AT, problems),
        broker_deaths=deaths,
        problems=tuple(problems),
    )


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


def _is_broker_header(name: str) -> bool:
    return (
        name in BROKER_HEADERS
        or name.startswith("x-first-death-")
        or name.startswith("x-last-death-")
    )


def _float32_exact(value: float) -> bool:
    try:
        return bool(struct.unpack("f", struct.pack("f", value))[0] == value)
    except (OverflowError, struct.error):
        return False


def _utf8(text: str) -> str:
    """``text`` as UTF-8 can carry it: lone surrogates (from ``surrogateescape``) replaced."""
    if text.isascii():  # most header text: no surrogate possible, no encoding needed
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()
    return text


def _key(key: object) -> str:
    return _utf8(str(key)[:128])


def _amqp_decimal(value: Decimal) -> bool:
    """Whether AMQP's decimal (an octet scale, a signed 32-bit mantissa) holds ``value``.

    The same arithmetic as pamqp's encoder, kept here so this module stays pure.
    """
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int):  # NaN, Infinity
        return False
    if exponent > 0:
        scale, mantissa = 0, int(value)
    else:
        scale, mantissa = -exponent, int(value.scaleb(-exponent))
    return 0 <= scale <= 255 and -(1 << 31) <= mantissa < 1 << 31


def _sanitize_value(value: object, depth: int) -> Any:
    """A header value pamqp can encode, keeping its meaning where possible."""
    if value is None or isinstance(value, bool | bytearray):
        return value
    if isinstance(value, datetime):
        # AMQP timestamps are unsigned seconds since the epoch (pamqp reads a naive
        # datetime as UTC): spell earlier moments out as text.
        aware = value if value.utcoffset() is not None else value.replace(tzinfo=UTC)
        return value if aware.timestamp() >= 0 else value.isoformat()
    if isinstance(value, int):
        return value if -(1 << 63) <= value < 1 << 63 else str(value)
    if isinstance(value, float):
        # pamqp encodes floats as 32-bit: keep those that survive, spell the rest out.
        if math.isfinite(value) and _float32_exact(value):
            return value
        return repr(value)
    if isinstance(value, Decimal):
        return value if _amqp_decimal(value) else str(value)
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, str):
        if len(value) > MAX_HEADER_STRING_CHARS:
            return _utf8(value[:MAX_HEADER_STRING_CHARS]) + "…[truncated]"
        return _utf8(value)
    if depth >= MAX_HEADER_DEPTH:
        return _utf8(repr(value)[:1000])
    if isinstance(value, Mapping):
        return {_key(k): _sanitize_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_sanitize_value(v, depth + 1) for v in value]
    return _utf8(repr(value)[:1000])


def sanitize_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers safe to re-publish: broker death headers removed, values made encodable.

    ``bytes`` become ``bytearray`` (AMQP byte arrays), floats that 32-bit
    encoding would change become their ``repr`` text, integers beyond 64 bits
    and undecodable Decimals become text, and nesting deeper than
    :data:`MAX_HEADER_DEPTH` becomes text.
    """
    if not isinstance(headers, Mapping):
        return {}
    return {
        _key(k): _sanitize_value(v, 0) for k, v in headers.items() if not _is_broker_header(str(k))
    }


def _bounded(text: str, limit: int, *, keep_end: bool = False) -> str:
    text = _utf8(text)  # an OSError's message may carry lone surrogates from a file name
    if len(text) <= limit:
        return text
    marker = "…[truncated]"
    if keep_end:
        return marker + text[-(limit - len(marker)) :]
    return text[: limit - len(marker)] + marker


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the exception's ``__str__`` itself fails."""
    try:
        return str(exc)
    except Exception as err:
        return f"<str() of {exception_name(exc)} raised {type(err).__name__}>"


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, bounded."""
    return _bounded(f"{exception_name(exc)}: {exception_text(exc)}", MAX_ERROR_CHARS)


def exception_name(exc: BaseException | None) -> str:
    """Qualified name of ``exc``'s type, ``builtins`` left out; ``"unknown"`` for ``None``.

    The one spelling of an exception type: the ``x-exception-type`` header,
    the ``error.type`` span attribute and the metrics' labels all use it.
    """
    if exc is None:
        return "unknown"
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def scheduled_headers(headers: Mapping[str, Any] | None, *, due_at: datetime) -> dict[str, Any]:
    """Headers for a message entering the chain: sanitized, with its absolute due time."""
    out = sanitize_headers(headers)
    out[X_DUE_AT] = to_epoch_ms(due_at)
    return out


def forwarded_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers of a message as delivered to its exchange by a forwarder: without the chain's own."""
    out = sanitize_headers(headers)
    out.pop(X_DUE_AT, None)
    out.pop(X_FORWARD_ROUTING_KEY, None)
    return out


def failure_headers(
    headers: Mapping[str, Any] | None,
    state: RetryState,
    exc: BaseException,
    *,
    now: datetime,
    retries: int,
    runs: int | None = None,
) -> dict[str, Any]:
    """Headers recording one more failure of a message; ``retries`` is the new count.

    ``runs``: how many times the handler ran in this delivery, appended to
    :data:`X_IMMEDIATE_RUNS` (given only when immediate retries are on).
    """
    out = sanitize_headers(headers)
    if runs is not None:
        history = out.get(X_IMMEDIATE_RUNS)
        old = history if isinstance(history, list) else []
        kept = [n for n in old if isinstance(n, int) and not isinstance(n, bool)]
        out[X_IMMEDIATE_RUNS] = [*kept, runs][-MAX_IMMEDIATE_HISTORY:]
    out[X_RETRY] = retries
    out[X_FIRST_FAILURE_AT] = to_epoch_ms(state.first_failure_at or now)
    out[X_LAST_FAILURE_AT] = to_epoch_ms(now)
    out[X_LAST_ERROR] = describe_exception(exc)
    out[X_ORIGINAL_EXCHANGE] = state.original_exchange
    out[X_ORIGINAL_ROUTING_KEY] = state.original_routing_key
    if state.queue is not None:
        out[X_QUEUE] = state.queue
    return out


def parking_headers(
    headers: Mapping[str, Any] | None,
    state: RetryState,
    exc: BaseException,
    *,
    now: datetime,
    reason: str,
    runs: int | None = None,
) -> dict[str, Any]:
    """The parking record: failure headers plus reason, time, exception type, message, traceback."""
    out = failure_headers(headers, state, exc, now=now, retries=state.retries, runs=runs)
    out.pop(X_DUE_AT, None)
    out[X_PARKED_REASON] = reason
    out[X_PARKED_AT] = to_epoch_ms(now)
    out[X_EXCEPTION_TYPE] = exception_name(exc)
    out[X_EXCEPTION_MESSAGE] = _bounded(exception_text(exc), MAX_ERROR_CHARS)
    trace = "".join(tb.format_exception(exc))
    out[X_EXCEPTION_TRACEBACK] = _bounded(trace, MAX_TRACEBACK_CHARS, keep_end=True)
    if state.problems:
        out[X_HEADER_PROBLEMS] = _bounded("; ".join(state.problems), MAX_ERROR_CHARS)
    return out


def encode_body_preview(body: bytes, limit: int = 200) -> str:
    """A printable preview of a body: UTF-8 text when it is, base64 otherwise."""
    chunk = body[:limit]
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(chunk).decode("ascii")
