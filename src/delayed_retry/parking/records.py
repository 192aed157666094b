"""Parked messages as records, the filter that selects them, and the headers of a replay. Pure.

Use :func:`read_record` to turn a parked message's headers and body into a
:class:`ParkedRecord`, :class:`ParkedFilter` to say which records an operation
means, and :func:`replay_headers` for the headers a replayed copy carries. The
operations themselves (browse, replay, purge) are in
:mod:`delayed_retry.parking.lot`, which re-exports these names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from delayed_retry.chain.topology import DelayTopology, Route
from delayed_retry.consumer.rejections import newest_death
from delayed_retry.durations import to_epoch_ms, to_seconds, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.names import (
    X_DUE_AT,
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TRACEBACK,
    X_EXCEPTION_TYPE,
    X_FIRST_FAILURE_AT,
    X_HEADER_PROBLEMS,
    X_IMMEDIATE_RUNS,
    X_LAST_ERROR,
    X_LAST_FAILURE_AT,
    X_PARKED_AT,
    X_PARKED_NOTE,
    X_PARKED_REASON,
    X_PARKED_REFRESHED_AT,
    X_QUEUE,
    X_REPLAY_CANARY,
    X_REPLAYED,
    X_REPLAYED_AT,
    X_REPLAYED_BY,
    X_RETRY,
)
from delayed_retry.headers.retry_state import parse_retry_state, read_epoch_ms, scheduled_headers
from delayed_retry.headers.text import encode_body_preview
from delayed_retry.headers.values import header_int
from delayed_retry.parking.fingerprint import fingerprint_headers

__all__ = [
    "ALL_PARKED",
    "ParkedFilter",
    "ParkedMessage",
    "ParkedRecord",
    "parse_parked",
    "read_record",
    "record_id",
    "replay_copy",
    "replay_headers",
]


_RECORD_HEADERS = (
    X_PARKED_REASON,
    X_PARKED_AT,
    X_EXCEPTION_TYPE,
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TRACEBACK,
    X_HEADER_PROBLEMS,
    X_PARKED_NOTE,
    X_PARKED_REFRESHED_AT,
)
# A replay starts a fresh retry budget in every respect: the count and every time the
# decorator's stop/wait policies read are dropped (the decorator writes them again).
_BUDGET_HEADERS = (
    X_RETRY,
    X_FIRST_FAILURE_AT,
    X_LAST_FAILURE_AT,
    X_LAST_ERROR,
    X_QUEUE,
    X_IMMEDIATE_RUNS,
)


# -- records ------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ParkedMessage:
    """The failure record of a parked message, as people want to read it."""

    message_id: str | None
    queue: str | None
    reason: str
    exception_type: str | None
    exception_message: str | None
    attempts: int
    first_failure_at: datetime | None
    parked_at: datetime | None
    original_exchange: str
    original_routing_key: str
    body_preview: str


@dataclass(frozen=True, kw_only=True)
class ParkedRecord(ParkedMessage):
    """A parked message in full: its failure record, headers and body.

    ``id`` names it for ``show``/``replay --id``: its ``message_id``, or
    ``sha256:`` and the start of its body's digest when it has none.
    ``fingerprint`` groups records that failed the same way.
    """

    id: str
    headers: Mapping[str, Any] = field(repr=False)
    body: bytes = field(repr=False)
    content_type: str | None = None
    traceback: str | None = None
    replays: int = 0
    replayed_at: datetime | None = None
    refreshed_at: datetime | None = None
    """When ``parking refresh`` last moved it to the tail of its parking queue."""
    fingerprint: str = ""
    failure: str = ""
    """The failure group in words: ``TimeoutError in gateway.py:call: gateway did not …``."""

    def age(self, *, now: datetime) -> timedelta | None:
        """How long ago it was parked, or ``None`` when the record does not say."""
        return None if self.parked_at is None else now - self.parked_at

    @property
    def in_queue_since(self) -> datetime | None:
        """When it entered the parking queue as it is now: parked, or last refreshed.

        This, not the parking time, says how far back in the queue's log the
        message sits (see :mod:`~delayed_retry.parking.refresh`).
        """
        times = [t for t in (self.parked_at, self.refreshed_at) if t is not None]
        return max(times) if times else None


def parse_parked(
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None,
    body: bytes,
    exchange: str | None = None,
    routing_key: str | None = None,
) -> ParkedMessage:
    """Read a parking record from headers; foreign messages read as reason ``unknown``."""
    h: Mapping[str, Any] = headers if isinstance(headers, Mapping) else {}
    state = parse_retry_state(h, exchange=exchange, routing_key=routing_key, queue=None)
    reason = h.get(X_PARKED_REASON)
    queue = state.queue
    death = newest_death(h) if not isinstance(reason, str) else None
    if death is not None and death.reason == "delivery_limit":
        # Dead-lettered here by the broker past the work queue's delivery limit (see
        # work_queue_arguments): a message no consumer could take, often one the client
        # cannot decode. Its x-death entry is the record.
        reason = "delivery-limit"
        queue = queue or death.queue
    elif not isinstance(reason, str):
        # Caught by the chain's alternate exchange (its destination queue is gone): the
        # delivery names the last level it passed, not the unroutable exchange, but the
        # due time it carried through the chain tells where it came from.
        from_chain = X_DUE_AT in h or (exchange or "").endswith(".unroutable")
        reason = "unroutable" if from_chain else "unknown"
    exc_type = h.get(X_EXCEPTION_TYPE)
    exc_msg = h.get(X_EXCEPTION_MESSAGE)
    return ParkedMessage(
        message_id=message_id,
        queue=queue,
        reason=reason,
        exception_type=exc_type if isinstance(exc_type, str) else None,
        exception_message=exc_msg if isinstance(exc_msg, str) else None,
        attempts=state.attempt,
        first_failure_at=state.first_failure_at,
        parked_at=read_epoch_ms(h.get(X_PARKED_AT)),
        original_exchange=state.original_exchange,
        original_routing_key=state.original_routing_key,
        body_preview=encode_body_preview(body),
    )


def record_id(message_id: str | None, body: bytes) -> str:
    """The id a message goes by in the parking lot and in the chain: its ``message_id``, or
    ``sha256:`` and the start of its body's digest when it has none."""
    return message_id or "sha256:" + hashlib.sha256(body).hexdigest()[:16]


def read_record(
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None,
    body: bytes,
    exchange: str | None = None,
    routing_key: str | None = None,
    content_type: str | None = None,
) -> ParkedRecord:
    """The full :class:`ParkedRecord` of a parked message; never raises on odd headers."""
    h: Mapping[str, Any] = headers if isinstance(headers, Mapping) else {}
    base = parse_parked(
        h, message_id=message_id, body=body, exchange=exchange, routing_key=routing_key
    )
    trace = h.get(X_EXCEPTION_TRACEBACK)
    replays = h.get(X_REPLAYED)
    group = fingerprint_headers(h)
    return ParkedRecord(
        **{f: getattr(base, f) for f in ParkedMessage.__dataclass_fields__},
        id=record_id(message_id, body),
        headers=dict(h),
        body=body,
        content_type=content_type,
        traceback=trace if isinstance(trace, str) else None,
        replays=header_int(replays) or 0,
        replayed_at=read_epoch_ms(h.get(X_REPLAYED_AT)),
        refreshed_at=read_epoch_ms(h.get(X_PARKED_REFRESHED_AT)),
        fingerprint=group.key,
        failure=group.label(),
    )


# -- the filter ---------------------------------------------------------------
def _header_text(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


@dataclass(frozen=True, kw_only=True)
class ParkedFilter:
    """Which parked messages an operation means; every given criterion must match.

    An empty filter matches everything. ``exception_type`` matches the
    qualified name or its last part (``TimeoutError`` matches
    ``asyncio.TimeoutError``); ``reason`` matches exactly; ``older_than`` and
    ``newer_than`` are ages since parking (a record without a parking time
    matches neither); ``in_queue_longer_than`` is the time since it entered
    the parking queue as it is now (:attr:`ParkedRecord.in_queue_since`: parked
    or last refreshed), what ``parking refresh`` selects by; ``headers`` are
    ``(name, substring)`` pairs; ``body_contains`` is a substring of the body read as UTF-8;
    ``fingerprint`` is a failure group's key; ``ids`` are record ids.
    """

    ids: frozenset[str] = frozenset()
    exception_type: str | None = None
    reason: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    in_queue_longer_than: timedelta | None = None
    headers: tuple[tuple[str, str], ...] = ()
    body_contains: str | None = None
    fingerprint: str | None = None

    def __post_init__(self) -> None:
        for name in ("older_than", "newer_than", "in_queue_longer_than"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, timedelta):
                object.__setattr__(self, name, timedelta(seconds=to_seconds(value, name=name)))
        if not isinstance(self.ids, frozenset):
            object.__setattr__(self, "ids", frozenset(self.ids))
        for pair in self.headers:
            if not (isinstance(pair, tuple) and len(pair) == 2 and pair[0]):
                raise ConfigurationError(
                    f"header filter {pair!r} is not a (name, substring) pair; write name=text"
                )

    @property
    def is_empty(self) -> bool:
        """Whether it matches every record."""
        return self == ParkedFilter()

    def matches(self, record: ParkedRecord, *, now: datetime | None = None) -> bool:
        """Whether ``record`` is selected; ``now`` (default: the current time) dates ages."""
        if self.ids and record.id not in self.ids and record.message_id not in self.ids:
            return False
        if self.exception_type is not None:
            kind = record.exception_type or ""
            if kind != self.exception_type and kind.rsplit(".", 1)[-1] != self.exception_type:
                return False
        if self.reason is not None and record.reason != self.reason:
            return False
        if self.fingerprint is not None and record.fingerprint != self.fingerprint:
            return False
        if self.older_than is not None or self.newer_than is not None:
            age = record.age(now=now or utcnow())
            if age is None:
                return False
            if self.older_than is not None and not age > self.older_than:
                return False
            if self.newer_than is not None and not age < self.newer_than:
                return False
        if self.in_queue_longer_than is not None:
            since = record.in_queue_since
            if since is None or not (now or utcnow()) - since > self.in_queue_longer_than:
                return False
        for name, text in self.headers:
            if name not in record.headers or text not in _header_text(record.headers[name]):
                return False
        if self.body_contains is not None:
            return self.body_contains in record.body.decode("utf-8", "replace")
        return True


def replay_headers(
    headers: Mapping[str, Any] | None,
    *,
    due_at: datetime,
    now: datetime | None = None,
    replayed_by: str | None = None,
) -> dict[str, Any]:
    """Headers of a replayed message: a fresh retry budget and a record of the replay.

    The parking record and every retry header the decorator's policies read
    (count, first and last failure, last error, queue) are removed, so the
    message is retried as if it had never failed; ``x-retry-replayed``
    counts replays, ``x-retry-replayed-at`` says when, ``x-retry-replayed-by``
    who (when given).
    """
    out = scheduled_headers(headers, due_at=due_at)
    previous = out.get(X_REPLAYED)
    count = header_int(previous) or 0
    for name in (*_RECORD_HEADERS, *_BUDGET_HEADERS, X_REPLAYED_BY, X_REPLAY_CANARY):
        out.pop(name, None)
    out[X_RETRY] = 0
    out[X_REPLAYED] = count + 1
    out[X_REPLAYED_AT] = to_epoch_ms(now or utcnow())
    if replayed_by:
        out[X_REPLAYED_BY] = replayed_by[:200]
    return out


ALL_PARKED = ParkedFilter()
"""The filter that selects every parked message (the default of every operation)."""


def replay_copy(
    headers: Mapping[str, Any] | None,
    *,
    topology: DelayTopology,
    target: str,
    delay: float,
    now: datetime,
    replayed_by: str | None = None,
    canary_token: str | None = None,
) -> tuple[Route, dict[str, Any]]:
    """Where a replayed copy is published and its headers: due ``delay`` seconds after ``now``.

    The headers are :func:`replay_headers` (a
    fresh retry budget), with the canary token when the copy is a canary.
    """
    due_at = now + timedelta(seconds=delay)
    route = topology.route(topology.units_until(due_at, now=now), target)
    out = replay_headers(headers, due_at=due_at, now=now, replayed_by=replayed_by)
    if canary_token is not None:
        out[X_REPLAY_CANARY] = canary_token
    return route, out
