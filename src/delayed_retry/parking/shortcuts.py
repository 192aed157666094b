"""Parked messages: read their failure record, look at them, send them back.

Use :func:`peek_parked` to see what is in a parking queue without taking
anything out, and :func:`replay_parked` once the cause is fixed. Replay sends
each message to the queue the operator names (by default the queue the
parking queue belongs to), never to a queue a header names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import aiormq
from aio_pika.abc import AbstractChannel

from delayed_retry.amqp.channels import scratch_channel, underlay_channel
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import Duration
from delayed_retry.errors import ConfigurationError, NotFoundError, parking_queue_not_found
from delayed_retry.parking.lot import (
    ParkedMessage,
    parse_parked,
    refuse_counted_peeks,
    replay_headers,
    replay_matching,
)
from delayed_retry.parking.scan import parking_name

__all__ = [
    "ParkedMessage",
    "ReplayResult",
    "parse_parked",
    "peek_parked",
    "replay_headers",
    "replay_parked",
]

log = logging.getLogger(__name__)


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
    limit (:data:`~delayed_retry.chain.topology.DELIVERY_LIMIT`) is out of
    reach of any number of peeks. On RabbitMQ 4.x a parking queue declared
    without it (by hand, by another tool, or by a checkout from before 0.1.0)
    has the broker's limit of 20, which peeks would exhaust: peeking it is
    refused with a :class:`ConfigurationError` naming the fix.
    """
    if limit < 1:
        raise ConfigurationError(f"limit={limit} must be at least 1")
    underlay = await underlay_channel(channel)
    parking = parking_name(topology, queue, parking_queue)
    # A channel of its own, closed at the end: the broker puts back every message taken.
    async with scratch_channel(underlay.connection) as browse:
        try:
            await browse.queue_declare(parking, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise NotFoundError(parking_queue_not_found(parking)) from exc
        await refuse_counted_peeks(underlay.connection, topology, queue, parking_queue)
        out: list[ParkedMessage] = []
        while len(out) < limit:
            got = await browse.basic_get(parking)
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


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did."""

    replayed: int
    to_queue: str


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
    due after the same delay. The caller's channel is only used to reach its
    connection: the work happens on channels of the replay's own. For
    filters, a rate, a canary or a dry run use
    :func:`delayed_retry.parking.lot.replay_matching`.
    """
    report = await replay_matching(
        channel,
        queue=queue,
        parking_queue=parking_queue,
        to_queue=to_queue,
        limit=limit,
        delay=delay,
        topology=topology,
        publish_timeout=publish_timeout,
    )
    return ReplayResult(report.done, report.to_queue or to_queue or queue)
