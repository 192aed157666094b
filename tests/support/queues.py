"""Queues and exchanges on a real broker: depths, existence, declaring, draining, clean-up.

Each helper takes a channel, a connection or a broker URL (``Where``); given a URL, it works
on a connection of its own, closed at the end, so that a synchronous test (a command line's)
calls it as ``asyncio.run(delete_all(rabbitmq_url, queues=[...]))``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Literal

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from delayed_retry import DelayTopology
from delayed_retry.chain.digest import markers
from tests.support.waiting import WAIT, wait_until

Where = AbstractChannel | AbstractConnection | str
"""A channel, a connection, or the URL of a broker to connect to for the one call."""


@contextlib.asynccontextmanager
async def connected(url: str) -> AsyncIterator[AbstractConnection]:
    """A plain connection to ``url`` for the body, closed after it."""
    connection = await aio_pika.connect(url)
    async with connection:
        yield connection


async def depth(where: Where, queue: str) -> int:
    """Messages ready in ``queue``, from a passive declare on the underlying aiormq channel.

    Given a connection, it declares on a channel of its own (a passive declare
    of a missing queue closes its channel). The underlay, because aio-pika's
    robust channel may answer a repeated ``declare_queue`` from its cache, with
    the count of the first declaration. Quorum queues count asynchronously:
    wait for a count with :func:`wait_for_depth`.
    """
    if isinstance(where, str):
        async with connected(where) as connection:
            return await depth(connection, queue)
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
    where: Where, queue: str, n: int, *, at_least: bool = False, timeout: float = WAIT
) -> None:
    """Wait until ``queue`` holds exactly ``n`` ready messages (``at_least``: ``n`` or more).

    A queue that does not exist (yet, or again: deleted and about to be
    declared anew by a consumer) has not reached it; the wait goes on.
    """
    if isinstance(where, str):
        async with connected(where) as connection:
            await wait_for_depth(connection, queue, n, at_least=at_least, timeout=timeout)
        return

    async def reached() -> bool:
        try:
            found = await depth(where, queue)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        return found >= n if at_least else found == n

    what = f"queue {queue!r} to hold {'at least ' if at_least else ''}{n} messages"
    await wait_until(reached, timeout=timeout, what=what)


async def exists(
    where: AbstractConnection | str, name: str, *, kind: Literal["queue", "exchange"] = "queue"
) -> bool:
    """Whether the queue (or exchange) ``name`` exists, from a passive declare on a channel of
    its own (a passive declare of a missing one closes its channel)."""
    if isinstance(where, str):
        async with connected(where) as connection:
            return await exists(connection, name, kind=kind)
    channel = await where.channel()
    try:
        if kind == "queue":
            await channel.declare_queue(name, passive=True)
        else:
            await channel.declare_exchange(name, passive=True)
        return True
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    finally:
        if not channel.is_closed:
            await channel.close()


async def declare_queue(
    where: Where, name: str, *, arguments: Mapping[str, Any] | None = None
) -> None:
    """Declare the durable queue ``name``, as an application would before a command uses it."""
    if isinstance(where, str):
        async with connected(where) as connection:
            await declare_queue(connection, name, arguments=arguments)
        return
    channel = await where.channel() if isinstance(where, AbstractConnection) else where
    await channel.declare_queue(name, durable=True, arguments=dict(arguments or {}))
    if channel is not where:
        await channel.close()


async def drain(where: Where, queue: str) -> list[AbstractIncomingMessage]:
    """Take every message ready in ``queue`` now, acknowledged as taken, oldest first."""
    if isinstance(where, str):
        async with connected(where) as connection:
            return await drain(connection, queue)
    channel = await where.channel() if isinstance(where, AbstractConnection) else where
    source = await channel.declare_queue(queue, passive=True)
    messages = []
    while (message := await source.get(fail=False, no_ack=True)) is not None:
        messages.append(message)
    if channel is not where:
        await channel.close()
    return messages


async def delete_all(
    where: Where,
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
    if isinstance(where, str):
        async with connected(where) as connection:
            await delete_all(connection, queues=queues, exchanges=exchanges, topology=topology)
        return
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
