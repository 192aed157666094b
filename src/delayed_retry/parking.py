"""Parked messages: read their failure record, look at them, send them back.

Use :func:`peek_parked` to see what is in a parking queue without taking
anything out, and :func:`replay_parked` once the cause is fixed. Replay sends
each message to the queue the operator names (by default the queue the
parking queue belongs to), never to a queue a header names.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from delayed_retry.checks import broker_major_version, kept_queue_risk
from delayed_retry.declare import declarer_for, underlay_of
from delayed_retry.durations import Duration, to_seconds, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers import (
    X_DUE_AT,
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TYPE,
    X_PARKED_AT,
    X_PARKED_REASON,
    X_RETRY,
    encode_body_preview,
    parse_retry_state,
    read_epoch_ms,
    scheduled_headers,
)
from delayed_retry.publishing import DEFAULT_PUBLISH_TIMEOUT, publish_copy
from delayed_retry.topology import DEFAULT_TOPOLOGY, DelayTopology, amqp_arguments

__all__ = ["ParkedMessage", "ReplayResult", "parse_parked", "peek_parked", "replay_parked"]

log = logging.getLogger(__name__)

X_REPLAYED = "x-retry-replayed"
"""How many times a message has been replayed from parking."""

_RECORD_HEADERS = (
    X_PARKED_REASON,
    X_PARKED_AT,
    X_EXCEPTION_TYPE,
    X_EXCEPTION_MESSAGE,
    "x-exception-traceback",
    "x-retry-header-problems",
    "x-parked-note",
)


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
    if not isinstance(reason, str):
        # Caught by the chain's alternate exchange (its destination queue is gone): the
        # delivery names the last level it passed, not the unroutable exchange, but the
        # due time it carried through the chain tells where it came from.
        from_chain = X_DUE_AT in h or (exchange or "").endswith(".unroutable")
        reason = "unroutable" if from_chain else "unknown"
    parked_at = read_epoch_ms(h.get(X_PARKED_AT))
    exc_type = h.get(X_EXCEPTION_TYPE)
    exc_msg = h.get(X_EXCEPTION_MESSAGE)
    return ParkedMessage(
        message_id=message_id,
        queue=state.queue,
        reason=reason,
        exception_type=exc_type if isinstance(exc_type, str) else None,
        exception_message=exc_msg if isinstance(exc_msg, str) else None,
        attempts=state.attempt,
        first_failure_at=state.first_failure_at,
        parked_at=parked_at,
        original_exchange=state.original_exchange,
        original_routing_key=state.original_routing_key,
        body_preview=encode_body_preview(body),
    )


def _parking_name(topology: DelayTopology, queue: str, parking_queue: str | None) -> str:
    return parking_queue or topology.default_parking_queue(queue)


async def peek_parked(
    channel: AbstractChannel,
    *,
    queue: str,
    parking_queue: str | None = None,
    limit: int = 20,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
) -> list[ParkedMessage]:
    """Up to ``limit`` parked messages of ``queue``, left in place.

    The messages are fetched unacked on a channel of their own, which is then
    closed, so the broker puts every one of them back. Each such return counts
    as a delivery (RabbitMQ 3.10 and 4.0 alike); the parking queue's delivery
    limit (:data:`~delayed_retry.topology.PARKED_DELIVERY_LIMIT`) is out of
    reach of any number of peeks. On RabbitMQ 4.x a parking queue declared
    without it (by an older delayed-retry) has the broker's limit of 20, which
    peeks would exhaust: peeking it is refused with a :class:`ConfigurationError`
    naming the fix.
    """
    if limit < 1:
        raise ConfigurationError(f"limit={limit} must be at least 1")
    underlay = await underlay_of(channel)
    # A channel of its own, closed at the end: the broker puts back every message taken.
    browse = await underlay.connection.channel(publisher_confirms=False)
    try:
        try:
            await browse.queue_declare(_parking_name(topology, queue, parking_queue), passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise ConfigurationError(
                f"parking queue {_parking_name(topology, queue, parking_queue)!r} does not "
                "exist; check --queue/--parking-queue"
            ) from exc
        await _refuse_counted_peeks(underlay.connection, topology, queue, parking_queue)
        out: list[ParkedMessage] = []
        while len(out) < limit:
            got = await browse.basic_get(_parking_name(topology, queue, parking_queue))
            if got.delivery_tag is None:
                break
            out.append(
                parse_parked(
                    got.header.properties.headers,
                    message_id=got.header.properties.message_id,
                    body=got.body,
                    exchange=got.exchange,
                    routing_key=got.routing_key,
                )
            )
        return out
    finally:
        if not browse.is_closed:
            await browse.close()


async def _refuse_counted_peeks(
    connection: Any, topology: DelayTopology, queue: str, parking_queue: str | None
) -> None:
    """Raise when peeking would count toward a delivery limit that can drop parked messages."""
    major = broker_major_version(getattr(connection, "server_properties", None))
    spec = topology.parking_queue_spec(queue, parking_queue)
    if major is None or major < 4 or topology.queue_type != "quorum":
        return
    check = await connection.channel(publisher_confirms=False)
    try:
        await check.queue_declare(spec.name, durable=True, arguments=amqp_arguments(spec.arguments))
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        if "x-delivery-limit" not in str(exc):
            raise
        raise ConfigurationError(
            f"{kept_queue_risk(queue=spec.name, broker_major=major)}. peek_parked does not "
            "peek it meanwhile, since every peek would bring its messages closer to the limit"
        ) from exc
    finally:
        if not check.is_closed:
            await check.close()


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did."""

    replayed: int
    to_queue: str


def replay_headers(headers: Mapping[str, Any] | None, *, due_at: datetime) -> dict[str, Any]:
    """Headers of a replayed message: retry count reset, parking record removed, replay counted."""
    out = scheduled_headers(headers, due_at=due_at)
    previous = out.get(X_REPLAYED)
    count = previous if isinstance(previous, int) and not isinstance(previous, bool) else 0
    for name in _RECORD_HEADERS:
        out.pop(name, None)
    out[X_RETRY] = 0
    out[X_REPLAYED] = count + 1
    return out


async def replay_parked(
    channel: AbstractChannel,
    *,
    queue: str,
    parking_queue: str | None = None,
    to_queue: str | None = None,
    limit: int | None = None,
    delay: Duration = 0,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
) -> ReplayResult:
    """Send parked messages of ``queue`` back to ``to_queue`` (default ``queue``) through the chain.

    Each message gets a fresh retry budget. It is taken from the parking
    queue, published with confirms, and only then acked: a crash replays a
    message twice at worst. ``delay`` spreads nothing: every message comes
    due after the same delay. Returns how many were replayed.
    """
    seconds = to_seconds(delay)
    target = to_queue or queue
    topology.check_destination(target)
    underlay = await underlay_of(channel)
    await declarer_for(underlay.connection).destination(
        underlay.connection, topology, target, with_parking=False
    )
    source = await channel.declare_queue(
        _parking_name(topology, queue, parking_queue), passive=True
    )
    count = 0
    while limit is None or count < limit:
        message: AbstractIncomingMessage | None = await source.get(no_ack=False, fail=False)
        if message is None:
            break
        now = utcnow()
        due_at = now + timedelta(seconds=seconds)
        route = topology.route(topology.units_until(due_at, now=now), target)
        headers = replay_headers(message.headers, due_at=due_at)
        try:
            await publish_copy(
                underlay,
                message,
                exchange=route.exchange,
                routing_key=route.routing_key,
                headers=headers,
                timeout=publish_timeout,
            )
        except BaseException:
            await message.nack(requeue=True)
            raise
        await message.ack()
        count += 1
    log.info("replayed %d message(s) from the parking queue of %r to %r", count, queue, target)
    return ReplayResult(count, target)
