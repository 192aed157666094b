"""Read what a consumer's rejection tells the router: which queue, how often. Pure.

A consumer in any language that rejects a message (``basic.reject`` or
``basic.nack`` without requeue) from a queue whose ``x-dead-letter-exchange``
is the chain's :attr:`~delayed_retry.chain.topology.DelayTopology.rejected_exchange`
makes the broker dead-letter it there, with an ``x-death`` entry naming the
queue, the reason, the exchange and routing keys it was published with, and a
count. :func:`read_rejection` turns those headers (and our own ``x-retry``)
into a :class:`Rejection`; :mod:`delayed_retry.consumer.router` acts on it.

Counting: the router strips ``x-death`` before re-publishing, so on every
version the broker's count for the queue starts again at 1 on each pass, and
RabbitMQ 4.x owns ``x-death`` outright (a client-published one is replaced).
The number of earlier failures is therefore our own ``x-retry`` header; a
broker count above 1 (a history that was not stripped) counts too, minus the
rejection being handled now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from delayed_retry.headers.names import X_DEATH
from delayed_retry.headers.retry_state import MAX_RETRY_COUNT, RetryState, parse_retry_state
from delayed_retry.headers.values import header_int

__all__ = ["RETRIED_REASONS", "DeathRecord", "Rejection", "read_rejection", "newest_death"]

RETRIED_REASONS = ("rejected", "delivery_limit")
"""Dead-letter reasons that mean a consumer failed on the message: these are retried.

``expired`` and ``maxlen`` mean no consumer failed (the team's queue has a TTL
or a length limit): such messages are parked at once, with the reason.
"""

RejectionProblem = Literal["no-death-record", "unknown-queue"]


@dataclass(frozen=True, kw_only=True)
class DeathRecord:
    """The newest ``x-death`` entry of a message: where it died and why."""

    queue: str
    reason: str
    count: int
    exchange: str
    routing_key: str
    time: datetime | None


@dataclass(frozen=True, kw_only=True)
class Rejection:
    """What the router knows about one dead-lettered message.

    ``queue`` is set only when the death names one of the router's queues;
    ``problem`` says why not otherwise (and ``claimed_queue`` what the headers
    named, for the record: it is never used to route). ``state`` is the retry
    state of the failure being handled: ``state.retries`` earlier failures.
    """

    queue: str | None
    claimed_queue: str | None
    reason: str | None
    problem: RejectionProblem | None
    state: RetryState | None


def _str(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return None


def newest_death(headers: Mapping[str, Any] | None) -> DeathRecord | None:
    """The newest (first) well-formed ``x-death`` entry, or ``None`` when there is none."""
    if not isinstance(headers, Mapping):
        return None
    deaths = headers.get(X_DEATH)
    if not isinstance(deaths, list | tuple) or not deaths:
        return None
    entry = deaths[0]
    if not isinstance(entry, Mapping):
        return None
    queue, reason = _str(entry.get("queue")), _str(entry.get("reason"))
    if not queue or not reason:
        return None
    keys = entry.get("routing-keys")
    first_key = _str(keys[0]) if isinstance(keys, list | tuple) and keys else None
    count = header_int(entry.get("count"))
    when = entry.get("time")
    return DeathRecord(
        queue=queue,
        reason=reason,
        count=count if count is not None and 0 < count <= MAX_RETRY_COUNT else 1,
        exchange=_str(entry.get("exchange")) or "",
        routing_key=first_key or "",
        time=when if isinstance(when, datetime) and when.tzinfo is not None else None,
    )


def read_rejection(headers: Mapping[str, Any] | None, *, queues: frozenset[str]) -> Rejection:
    """Read a dead-lettered message's headers; never raises, whatever they hold.

    Only a queue in ``queues`` (those the router was started with) is ever
    returned as ``queue``: a message naming another, or with no ``x-death``
    at all (published straight to the rejected exchange), gets a ``problem``.
    """
    death = newest_death(headers)
    if death is None:
        return Rejection(
            queue=None, claimed_queue=None, reason=None, problem="no-death-record", state=None
        )
    if death.queue not in queues:
        return Rejection(
            queue=None,
            claimed_queue=death.queue,
            reason=death.reason,
            problem="unknown-queue",
            state=None,
        )
    # Our own headers first (they survive re-publishing); the death's exchange and key
    # are the original ones only on the first pass, which is when the headers lack them.
    without_deaths = {k: v for k, v in (headers or {}).items() if k != X_DEATH}
    state = parse_retry_state(
        without_deaths, exchange=death.exchange, routing_key=death.routing_key, queue=death.queue
    )
    earlier = max(state.retries, min(death.count - 1, MAX_RETRY_COUNT))
    state = replace(state, retries=earlier, attempt=earlier + 1, broker_deaths=death.count)
    return Rejection(
        queue=death.queue,
        claimed_queue=death.queue,
        reason=death.reason,
        problem=None,
        state=state,
    )
