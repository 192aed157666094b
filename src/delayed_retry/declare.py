"""Declare the delay topology on a broker: idempotent, cached per connection.

Every consumer may call this at start-up and on first use: declarations are
sent once per AMQP connection and again after a reconnect (a robust
connection's new underlying connection is a new cache key). Declarations run
on a short-lived channel of their own, so an argument mismatch, which makes
the broker close the channel, never closes the caller's channel.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.errors import ConfigurationError, TopologyMismatchError
from delayed_retry.topology import DEFAULT_TOPOLOGY, DelayTopology, QueueSpec, amqp_arguments

__all__ = [
    "TopologyDeclarer",
    "declare_topology",
    "declare_parking_queue",
    "declarer_for",
    "underlay_of",
]

log = logging.getLogger(__name__)


async def _on_fresh_channel(
    connection: aiormq.abc.AbstractConnection,
    action: Callable[[aiormq.abc.AbstractChannel], Awaitable[None]],
) -> None:
    channel = await connection.channel(publisher_confirms=False)
    try:
        await action(channel)
    finally:
        if not channel.is_closed:
            await channel.close()


def _explain(exc: aiormq.exceptions.ChannelClosed, what: str, wanted: Any) -> Exception:
    text = str(exc)
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return TopologyMismatchError(
            f"{what} exists with other arguments than this topology wants ({wanted}); the broker "
            f"said: {text}. delayed-retry never deletes anything by itself: delete {what} "
            "(after moving its messages) or use another DelayTopology prefix"
        )
    if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
        return ConfigurationError(
            f"{what} refers to something that does not exist: {text}. Declare the queue "
            "before consuming from it or scheduling messages for it"
        )
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return ConfigurationError(
            f"the broker refused to declare {what}: {text}. Grant the user configure, write "
            "and read permissions on names starting with the topology prefix"
        )
    return exc


async def _declare_queue(channel: aiormq.abc.AbstractChannel, spec: QueueSpec) -> None:
    args: dict[str, Any] = dict(amqp_arguments(spec.arguments))
    try:
        await channel.queue_declare(spec.name, durable=True, arguments=args)
    except aiormq.exceptions.ChannelClosed as exc:
        raise _explain(exc, f"queue {spec.name!r}", args) from exc
    for exchange, key in spec.bindings:
        try:
            await channel.queue_bind(spec.name, exchange, routing_key=key)
        except aiormq.exceptions.ChannelClosed as exc:
            raise _explain(exc, f"binding of queue {spec.name!r} to {exchange!r}", key) from exc


async def _declare_topology(channel: aiormq.abc.AbstractChannel, topology: DelayTopology) -> None:
    for ex in topology.exchanges():
        args: dict[str, Any] = (
            {"alternate-exchange": ex.alternate_exchange} if ex.alternate_exchange else {}
        )
        try:
            await channel.exchange_declare(
                ex.name, exchange_type=ex.type, durable=True, arguments=args
            )
        except aiormq.exceptions.ChannelClosed as exc:
            raise _explain(exc, f"exchange {ex.name!r} ({ex.type})", args) from exc
    for destination, source, key in topology.exchange_bindings():
        await channel.exchange_bind(destination, source, routing_key=key)
    for spec in topology.queues():
        await _declare_queue(channel, spec)


async def declare_parking_queue(
    connection: aiormq.abc.AbstractConnection,
    topology: DelayTopology,
    queue: str,
    parking_queue: str | None = None,
) -> None:
    """Declare ``queue``'s parking queue and its binding (idempotent, not cached)."""
    spec = topology.parking_queue_spec(queue, parking_queue)
    await _on_fresh_channel(connection, lambda ch: _declare_queue(ch, spec))


class TopologyDeclarer:
    """Declarations already made on one connection, and the lock that serialises them."""

    def __init__(self) -> None:
        self._done: set[tuple[object, ...]] = set()
        self._lock = asyncio.Lock()

    async def _once(
        self,
        key: tuple[object, ...],
        connection: aiormq.abc.AbstractConnection,
        action: Callable[[aiormq.abc.AbstractChannel], Awaitable[None]],
    ) -> None:
        if key in self._done:
            return
        async with self._lock:
            if key in self._done:
                return
            await _on_fresh_channel(connection, action)
            self._done.add(key)

    async def topology(
        self, connection: aiormq.abc.AbstractConnection, topology: DelayTopology
    ) -> None:
        """Declare the chain, delivery, unroutable and parking exchanges and queues."""

        async def action(channel: aiormq.abc.AbstractChannel) -> None:
            await _declare_topology(channel, topology)
            log.debug("declared delay topology %r (%d levels)", topology.prefix, topology.levels)

        await self._once(("topology", topology), connection, action)

    async def destination(
        self,
        connection: aiormq.abc.AbstractConnection,
        topology: DelayTopology,
        queue: str,
        parking_queue: str | None = None,
        *,
        with_parking: bool = True,
    ) -> None:
        """Bind ``queue`` to the end of the chain and, unless told not to, declare its parking."""
        # with_parking in the key: a binding made for scheduling (no parking) must not
        # stand in for a consumer's, which also needs its parking queue.
        done_key = ("destination", topology, queue, parking_queue, with_parking)
        if done_key in self._done:  # every message comes through here: stay cheap
            return
        await self.topology(connection, topology)
        exchange, key = topology.delivery_binding(queue)

        async def action(channel: aiormq.abc.AbstractChannel) -> None:
            try:
                await channel.queue_bind(queue, exchange, routing_key=key)
            except aiormq.exceptions.ChannelClosed as exc:
                raise _explain(
                    exc, f"queue {queue!r}", "a binding to the delivery exchange"
                ) from exc
            if with_parking:
                await _declare_queue(channel, topology.parking_queue_spec(queue, parking_queue))

        await self._once(done_key, connection, action)


_declarers: weakref.WeakKeyDictionary[aiormq.abc.AbstractConnection, TopologyDeclarer] = (
    weakref.WeakKeyDictionary()
)


def declarer_for(connection: aiormq.abc.AbstractConnection) -> TopologyDeclarer:
    """The declaration cache of ``connection``; a reconnect brings a new, empty one."""
    declarer = _declarers.get(connection)
    if declarer is None:
        declarer = _declarers[connection] = TopologyDeclarer()
    return declarer


async def underlay_of(channel: Any) -> aiormq.abc.AbstractChannel:
    """The aiormq channel under an aio-pika channel (or the aiormq channel itself)."""
    if isinstance(channel, aiormq.abc.AbstractChannel):
        return channel
    get = getattr(channel, "get_underlay_channel", None)
    if get is None:
        raise ConfigurationError(f"{channel!r} is not an aio-pika or aiormq channel")
    underlay: aiormq.abc.AbstractChannel = await get()
    return underlay


async def declare_topology(
    channel: Any, topology: DelayTopology = DEFAULT_TOPOLOGY, *, queues: Iterable[str] = ()
) -> None:
    """Declare ``topology`` now, and bind ``queues`` to its end (with their parking queues).

    Optional: the decorator and :func:`~delayed_retry.publish_delayed` declare
    what they need on first use. Call it at start-up to fail fast on a
    mismatch. ``channel`` is an aio-pika or aiormq channel; the declarations
    are cached per connection, so calling it again costs nothing.
    """
    underlay = await underlay_of(channel)
    declarer = declarer_for(underlay.connection)
    await declarer.topology(underlay.connection, topology)
    for queue in queues:
        await declarer.destination(underlay.connection, topology, queue)
