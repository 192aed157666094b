"""Queue depths and clean-up on a real broker, shared by every broker test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection

from delayed_retry import DelayTopology
from delayed_retry.chain.digest import markers
from tests.support.waiting import WAIT, wait_until


async def depth(where: AbstractChannel | AbstractConnection, queue: str) -> int:
    """Messages ready in ``queue``, from a passive declare on the underlying aiormq channel.

    Given a connection, it declares on a channel of its own (a passive declare
    of a missing queue closes its channel). The underlay, because aio-pika's
    robust channel may answer a repeated ``declare_queue`` from its cache, with
    the count of the first declaration. Quorum queues count asynchronously:
    wait for a count with :func:`wait_for_depth`.
    """
    if isinstance(where, AbstractConnection):
        channel = await where.channel()
        try:
            return await depth(channel, queue)
        finally:
            with contextlib.suppress(Exception):  # closed by the broker if the queue is missing
                await channel.close()
    underlay = await where.get_underlay_channel()
    result = await underlay.queue_declare(queue, passive=True)
    return int(result.message_count or 0)


async def wait_for_depth(
    where: AbstractChannel | AbstractConnection, queue: str, n: int, *, timeout: float = WAIT
) -> None:
    """Wait until ``queue`` holds exactly ``n`` ready messages.

    A queue that does not exist (yet, or again: deleted and about to be
    declared anew by a consumer) has not reached it; the wait goes on.
    """

    async def reached() -> bool:
        try:
            return await depth(where, queue) == n
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False

    await wait_until(reached, timeout=timeout, what=f"queue {queue!r} to hold {n} messages")


async def delete_all(
    where: AbstractChannel | AbstractConnection,
    *,
    queues: Iterable[str] = (),
    exchanges: Iterable[str] = (),
    topology: DelayTopology | None = None,
) -> None:
    """Delete ``queues`` and ``exchanges``, and with ``topology`` its chain (its markers
    included) and parking queues.

    With a topology, each of ``queues`` also loses its default parking queue.
    What is already gone is skipped. Given a connection, it works on channels of
    its own, opening a new one after an error closes one; given a channel (of a
    node a test may have broken), it stops quietly at the first error.
    """
    queue_names = list(queues)
    exchange_names = list(exchanges)
    if topology is not None:
        queue_names += [topology.default_parking_queue(q) for q in queue_names]
        queue_names += [spec.name for spec in topology.queues()] + [topology.mutes_stream]
        exchange_names += [spec.name for spec in topology.exchanges()]
        exchange_names += markers(topology)
    own = isinstance(where, AbstractConnection)
    channel = await where.channel() if isinstance(where, AbstractConnection) else where
    try:
        for kind, names in (("queue", queue_names), ("exchange", exchange_names)):
            for name in names:
                try:
                    underlay = await channel.get_underlay_channel()
                    if kind == "queue":
                        await underlay.queue_delete(name)
                    else:
                        await underlay.exchange_delete(name)
                except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError):
                    if not isinstance(where, AbstractConnection):
                        return  # a channel we were given and cannot replace
                    channel = await where.channel()
    finally:
        if own:
            with contextlib.suppress(Exception):
                await channel.close()


@contextlib.asynccontextmanager
async def cleaned(
    connection: AbstractConnection, topology: DelayTopology, queues: Iterable[str]
) -> AsyncIterator[None]:
    """Run the body, then :func:`delete_all` the topology and ``queues``, failed or not."""
    names = list(queues)
    try:
        yield
    finally:
        await delete_all(connection, topology=topology, queues=names)
