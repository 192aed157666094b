"""Reading a parking queue as it was when asked, without removing anything.

Every parking-lot operation reads through :func:`take` on a channel from
:func:`own_channel`: messages are taken unacked, so none is taken twice, and
closing the channel gives back every one the operation did not ack. Use
:func:`queue_depth` first (it names a missing parking queue) and
:func:`refuse_counted_reads` before taking anything.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.amqp.channels import scratch_channel, underlay_channel
from delayed_retry.chain.topology import DelayTopology, amqp_arguments
from delayed_retry.errors import ConfigurationError, NotFoundError, parking_queue_not_found
from delayed_retry.parking.records import ParkedRecord, read_record
from delayed_retry.rabbitmq.delivery_limits import kept_classic_queue_risk, kept_queue_risk
from delayed_retry.rabbitmq.versions import broker_major_version

__all__ = [
    "own_channel",
    "parking_name",
    "queue_depth",
    "refuse_counted_peeks",
    "refuse_counted_reads",
    "take",
]

log = logging.getLogger(__name__)


def parking_name(topology: DelayTopology, queue: str, parking_queue: str | None) -> str:
    """The parking queue of ``queue``: ``parking_queue`` if given, else the default name."""
    return parking_queue or topology.default_parking_queue(queue)


@asynccontextmanager
async def own_channel(channel: Any, *, confirms: bool) -> AsyncIterator[aiormq.abc.AbstractChannel]:
    """A channel of the operation's own on ``channel``'s connection, closed after the block.

    Closing it returns every message not acked. ``channel`` (aio-pika or
    aiormq) only leads to the connection, so a refusal never closes it.
    """
    underlay = await underlay_channel(channel)
    async with scratch_channel(underlay.connection, confirms=confirms) as own:
        yield own


async def refuse_counted_peeks(
    connection: Any, topology: DelayTopology, queue: str, parking_queue: str | None
) -> None:
    """Raise when reading would count toward a delivery limit that can drop parked messages.

    Every read of the parking lot (peek, browse, replay, purge) takes messages
    unacked and gives back those it does not act on; each return counts as a
    delivery. On RabbitMQ 4.x a parking queue declared without delayed-retry's
    delivery limit has the broker's limit of 20, which reads would exhaust.
    ``connection`` is the aiormq connection.
    """
    major = broker_major_version(getattr(connection, "server_properties", None))
    spec = topology.parking_queue_spec(queue, parking_queue)
    if major is None or major < 4 or topology.queue_type != "quorum":
        return
    arguments: dict[str, Any] = dict(amqp_arguments(spec.arguments))
    async with scratch_channel(connection) as check:
        try:
            await check.queue_declare(spec.name, durable=True, arguments=arguments)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            if "x-queue-type" in str(exc):
                # A classic queue (made by hand or by another tool; 4.3 refuses the quorum
                # declaration where 3.x let it through): no delivery limit, reads are safe.
                log.warning("%s", kept_classic_queue_risk(queue=spec.name))
                return
            if "x-delivery-limit" not in str(exc):
                raise
            raise ConfigurationError(
                f"{kept_queue_risk(queue=spec.name, broker_major=major)}. peek_parked does not "
                "peek it meanwhile, since every peek would bring its messages closer to the limit"
            ) from exc


async def refuse_counted_reads(
    channel: Any, topology: DelayTopology, queue: str, parking_queue: str | None
) -> None:
    """:func:`refuse_counted_peeks` on ``channel``'s connection."""
    underlay = await underlay_channel(channel)
    await refuse_counted_peeks(underlay.connection, topology, queue, parking_queue)


async def queue_depth(own: aiormq.abc.AbstractChannel, parking: str) -> int:
    """Messages the broker counts in ``parking``; a missing queue is a :class:`NotFoundError`.

    On quorum queues the count leaves out messages a closed channel just
    returned: use it as a progress total, never as a bound.
    """
    try:
        declared = await own.queue_declare(parking, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise NotFoundError(parking_queue_not_found(parking)) from exc
    return int(declared.message_count or 0)


async def take(
    own: aiormq.abc.AbstractChannel, parking: str, *, asked_at: datetime
) -> AsyncIterator[tuple[aiormq.abc.DeliveredMessage, ParkedRecord]]:
    """The messages of ``parking`` that were there at ``asked_at``, taken unacked, in order.

    Every message taken stays unacked on ``own`` until it is acked or the
    channel closes, so none is taken twice and the scan ends when the queue
    has nothing more to give. Messages parked, replayed or refreshed after
    ``asked_at`` (their record says so) are put back untouched: the set is the
    one asked about.
    The declare-ok message count cannot bound the scan: on quorum queues it
    leaves out messages a closed channel just returned.
    """
    while True:
        got = await own.basic_get(parking, no_ack=False)
        if got.delivery_tag is None:
            return
        props = got.header.properties
        record = read_record(
            props.headers,
            message_id=props.message_id,
            body=got.body,
            exchange=got.exchange,
            routing_key=got.routing_key,
            content_type=props.content_type,
        )
        if record.parked_at is not None and record.parked_at > asked_at:
            continue
        # Replayed since (by this very operation, say, and parked again): the replay's own
        # clock wrote this time, so a consumer's clock skew cannot make it look old.
        if record.replayed_at is not None and record.replayed_at >= asked_at:
            continue
        # A copy this very refresh put at the tail. Times are written in whole
        # milliseconds, so compare with the start truncated alike, or a copy made in the
        # start's millisecond would be taken (and refreshed) again.
        if record.refreshed_at is not None and record.refreshed_at >= _whole_ms(asked_at):
            continue
        yield got, record


def _whole_ms(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)
