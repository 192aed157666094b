"""When the messages waiting in a level queue come due, read from their own headers.

A level's TTL bounds a waiting message's due time only from above: a message
in level ``n`` may still pass every lower level, so all the level alone says
is "due within 2^(n+1) - 1 units" (a 10-minute delay at 1 ms enters level 19
and shows as "due within 17 m 28 s"). Every message delayed-retry puts into
the chain carries its exact due time in ``x-retry-due-at``;
:func:`peek_due_times` reads it by taking up to ``limit`` messages unacked
and giving them all back when its channel closes (nothing is acked). Use it
for ``status``-like views, and only where a return cannot count toward a
drop: :func:`peeks_are_safe` says where.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from aio_pika.abc import AbstractConnection

from delayed_retry.amqp.channels import scratch_channel, underlay_connection
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.headers.names import X_DUE_AT
from delayed_retry.headers.retry_state import read_epoch_ms
from delayed_retry.rabbitmq.versions import broker_major_version

__all__ = ["DueTimes", "peek_due_times", "peeks_are_safe"]

PEEK_LIMIT = 100
"""Messages :func:`peek_due_times` reads from one level queue at most."""


@dataclass(frozen=True)
class DueTimes:
    """The due times read from the first messages of one level queue."""

    read: int
    """Messages read (at most the limit; the queue may hold more)."""
    earliest: datetime | None
    latest: datetime | None
    unknown: int
    """Messages read without a due time of their own (another producer's)."""

    @property
    def known(self) -> int:
        return self.read - self.unknown


async def peeks_are_safe(connection: AbstractConnection, topology: DelayTopology) -> bool:
    """Whether reading a level queue's messages leaves them where and when they were.

    A return counts as a delivery on RabbitMQ 4.x quorum queues, and level
    queues carry no delivery limit of delayed-retry's (the broker's default
    of 20 applies on 4.0-4.2): there a peek would bring a waiting message
    closer to being dead-lettered early, so it is not done.
    """
    if topology.queue_type == "classic":
        return True
    underlay = await underlay_connection(connection)
    major = broker_major_version(getattr(underlay, "server_properties", None))
    return major is not None and major < 4


async def peek_due_times(
    connection: AbstractConnection, queue: str, *, limit: int = PEEK_LIMIT
) -> DueTimes:
    """The due times of the first ``limit`` messages of level queue ``queue``.

    The messages are taken unacked on a channel of their own and all given
    back when it closes: a message keeps its place and its expiry (a classic
    queue puts it back where it was; a quorum queue keeps its enqueue time).
    """
    due: list[datetime] = []
    read = 0
    underlay = await underlay_connection(connection)
    async with scratch_channel(underlay) as channel:
        while read < limit:
            got = await channel.basic_get(queue, no_ack=False)
            if got.delivery_tag is None:
                break
            read += 1
            headers = got.header.properties.headers or {}
            moment = read_epoch_ms(headers.get(X_DUE_AT))
            if moment is not None:
                due.append(moment)
    return DueTimes(
        read=read,
        earliest=min(due, default=None),
        latest=max(due, default=None),
        unknown=read - len(due),
    )
