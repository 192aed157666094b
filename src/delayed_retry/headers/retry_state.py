"""The retry state a message carries in its headers: read it, and write the next one.

:func:`parse_retry_state` reads what a delivery has been through (never
raising, whatever the headers hold); :func:`failure_headers`,
:func:`scheduled_headers` and :func:`forwarded_headers` write the headers of
the copy that goes on: into the chain after a failure, into the chain for
later, out of it to an exchange. The broker's ``x-death`` is read only to
count rejections; every copy leaves without it (see
:func:`~delayed_retry.headers.values.sanitize_headers`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from delayed_retry.durations import from_epoch_ms, to_epoch_ms
from delayed_retry.headers.names import (
    X_DEATH,
    X_DUE_AT,
    X_FIRST_FAILURE_AT,
    X_FORWARD_ROUTING_KEY,
    X_IMMEDIATE_RUNS,
    X_LAST_ERROR,
    X_LAST_FAILURE_AT,
    X_ORIGINAL_EXCHANGE,
    X_ORIGINAL_ROUTING_KEY,
    X_QUEUE,
    X_RETRY,
)
from delayed_retry.headers.text import describe_exception, utf8
from delayed_retry.headers.values import MAX_HEADER_STRING_CHARS, header_int, sanitize_headers

__all__ = [
    "MAX_IMMEDIATE_HISTORY",
    "MAX_RETRY_COUNT",
    "RetryState",
    "failure_headers",
    "forwarded_headers",
    "parse_retry_state",
    "read_epoch_ms",
    "scheduled_headers",
]

MAX_RETRY_COUNT = 1_000_000
"""An ``x-retry`` above this is treated as malformed, not as a real count."""

MAX_IMMEDIATE_HISTORY = 100
"""Entries of :data:`~delayed_retry.headers.names.X_IMMEDIATE_RUNS` kept; ``x-retry`` still
counts every delivery."""
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
    ms = header_int(value)
    if ms is not None and 0 <= ms < 1 << 47:
        return from_epoch_ms(ms)
    problems.append(f"{name}={value!r:.60} is not milliseconds since the epoch; ignored")
    return None


def read_epoch_ms(value: object) -> datetime | None:
    """An epoch-milliseconds header value as an aware datetime, or ``None`` if it is not one."""
    return _epoch_ms(value, "", [])


def _text(value: object, name: str, problems: list[str]) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return utf8(value[:MAX_HEADER_STRING_CHARS])
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
        count = header_int(entry.get("count"))
        if count is not None and 0 < count <= MAX_RETRY_COUNT:
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
        count = header_int(raw)
        if count is not None and 0 <= count <= MAX_RETRY_COUNT:
            retries = count
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
        kept = [n for n in old if header_int(n) is not None]
        out[X_IMMEDIATE_RUNS] = [*kept, runs][-MAX_IMMEDIATE_HISTORY:]
    out[X_RETRY] = retries
    now_ms = to_epoch_ms(now)
    first = state.first_failure_at
    out[X_FIRST_FAILURE_AT] = now_ms if first is None else to_epoch_ms(first)
    out[X_LAST_FAILURE_AT] = now_ms
    out[X_LAST_ERROR] = describe_exception(exc)
    out[X_ORIGINAL_EXCHANGE] = state.original_exchange
    out[X_ORIGINAL_ROUTING_KEY] = state.original_routing_key
    if state.queue is not None:
        out[X_QUEUE] = state.queue
    return out
