"""What one connection has declared: the delay topology declared once per connection.

Every consumer may call this at start-up and on first use: declarations are
sent once per AMQP connection and again after a reconnect (a robust
connection's new underlying connection is a new cache key). Declarations run
on a short-lived channel of their own, so an argument mismatch, which makes
the broker close the channel, never closes the caller's channel. What is
sent, and how a refusal is explained, is :mod:`delayed_retry.amqp.chain_declaration`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.amqp.chain_declaration import (
    declare_in_full,
    declare_queue,
    declare_queue_then_fanout,
    log_memory_hint,
)
from delayed_retry.amqp.chain_marker import chain_is_marked_complete
from delayed_retry.amqp.channels import on_scratch_channel, underlay_channel
from delayed_retry.amqp.refusals import explain_refusal
from delayed_retry.chain.digest import markable
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology, QueueSpec
from delayed_retry.errors import ConfigurationError, NotFoundError

__all__ = [
    "EXISTS_CACHE_SECONDS",
    "TopologyDeclarer",
    "declare_topology",
    "declarer_for",
]

log = logging.getLogger(__name__)


EXISTS_CACHE_SECONDS = 1.0
"""How long ``publish_delayed`` trusts that an exchange it checked still exists."""

PARKING_REDECLARE_INTERVAL = 1.0
"""Seconds a parking queue's re-declaration counts as fresh for the parks that follow."""


class TopologyDeclarer:
    """What one connection has declared and checked: the per-connection state of the library.

    Declarations are made once per connection (under one lock), parking queues
    re-declared at most once per :data:`PARKING_REDECLARE_INTERVAL`, and
    exchange checks trusted for a moment. :meth:`forget` drops what a
    publish found missing, so the next use declares it again.
    """

    def __init__(self) -> None:
        self._done: set[tuple[object, ...]] = set()
        self._lock = asyncio.Lock()
        self._parking_at: dict[tuple[object, ...], float] = {}
        self._parking_now: dict[tuple[object, ...], asyncio.Future[None]] = {}
        self._exchange_seen: dict[str, float] = {}
        self.warned: set[str] = set()
        """Queues used as they are despite other arguments, already warned about."""
        self._exchange_checks: dict[str, asyncio.Lock] = {}
        self._repair: set[DelayTopology] = set()

    def forget(self, topology: DelayTopology) -> None:
        """Declare ``topology`` (and every destination of it) again on next use, in full.

        Call it when a publish into the chain found an exchange missing (deleted
        by hand, or by a mistaken teardown): the next hand-over puts it back,
        every binding included, whatever the chain's markers say.
        """
        self._done = {key for key in self._done if topology not in key}
        self._repair.add(topology)

    async def exchange_exists(
        self, connection: aiormq.abc.AbstractConnection, exchange: str, *, cache: float = 0.0
    ) -> None:
        """Raise :class:`ConfigurationError` naming ``exchange`` when it does not exist.

        ``cache`` seconds: trust a check this recent on this connection (an
        exchange deleted in between is caught by the forwarder, which parks).
        One check per exchange is in flight at a time: a burst of calls shares it.
        """
        if cache and time.monotonic() - self._exchange_seen.get(exchange, -math.inf) < cache:
            return
        lock = self._exchange_checks.setdefault(exchange, asyncio.Lock())
        async with lock:
            if cache and time.monotonic() - self._exchange_seen.get(exchange, -math.inf) < cache:
                return
            try:
                await on_scratch_channel(
                    connection, lambda ch: ch.exchange_declare(exchange, passive=True)
                )
            except aiormq.exceptions.ChannelNotFoundEntity as exc:
                raise ConfigurationError(
                    f"exchange {exchange!r} does not exist, so nothing could be delivered to "
                    "it; declare it (with its bindings) before scheduling messages for it"
                ) from exc
            self._exchange_seen[exchange] = time.monotonic()

    async def queue(self, connection: aiormq.abc.AbstractConnection, spec: QueueSpec) -> None:
        """Declare the queue of ``spec`` with its bindings, once on this connection.

        A queue with a delivery limit that exists without one (declared by an
        older version) is used as it is, with a warning naming the fix.
        """
        key = ("queue", spec.name, tuple(sorted(spec.arguments.items())), spec.bindings)
        await self._once(key, connection, lambda ch: declare_queue(ch, spec, warned=self.warned))

    async def fanout_with_queue(
        self, connection: aiormq.abc.AbstractConnection, spec: QueueSpec
    ) -> None:
        """Declare the queue of ``spec``, then its fanout exchange and the binding, back to back.

        For an exchange producers publish to as soon as it exists (the front
        door's ``X.delay``): the queue is declared first, unbound, and the
        exchange and the binding follow on one channel with no round trip in
        between, so the exchange never stands unbound while a producer could
        see it (a fanout exchange with no queue drops what it gets). Every
        binding of ``spec`` must be to its one exchange. Once per connection.
        """
        exchanges = {exchange for exchange, _ in spec.bindings}
        if len(exchanges) != 1:
            raise ConfigurationError(
                f"queue {spec.name!r} must be bound to exactly one exchange, not {exchanges!r}"
            )
        (exchange,) = exchanges
        key = ("fanout-queue", spec.name, tuple(sorted(spec.arguments.items())), spec.bindings)
        await self._once(
            key,
            connection,
            lambda ch: declare_queue_then_fanout(ch, spec, exchange, warned=self.warned),
        )

    async def forward_queue(
        self, connection: aiormq.abc.AbstractConnection, topology: DelayTopology, exchange: str
    ) -> str:
        """Declare ``exchange``'s forward queue, bound to the chain's end, and its parking.

        Once per connection: a retry returning to an exchange comes through here
        each time. Returns the queue's name.
        """
        spec = topology.forward_queue_spec(exchange)
        await self.topology(connection, topology)
        await self._once(
            ("forward-queue", topology, spec.name),
            connection,
            lambda ch: declare_queue(ch, spec, warned=self.warned),
        )
        await self.destination(connection, topology, spec.name)
        return spec.name

    def has_destination(
        self, topology: DelayTopology, queue: str, parking_queue: str | None = None
    ) -> bool:
        """Whether :meth:`destination` (with parking) has succeeded on this connection."""
        return ("destination", topology, queue, parking_queue, True) in self._done

    async def parking(
        self,
        connection: aiormq.abc.AbstractConnection,
        topology: DelayTopology,
        queue: str,
        parking_queue: str | None = None,
    ) -> None:
        """Re-declare ``queue``'s parking queue before a park, so one deleted by hand is back.

        Concurrent parks share one declaration (one channel), and a declaration
        serves the parks of the next :data:`PARKING_REDECLARE_INTERVAL` seconds:
        a storm of parks opens a bounded number of channels, never one each
        (the broker closes the whole connection past its ``channel_max``). A
        park in that window after a deletion is caught by the parking
        exchange's alternate exchange, in the unroutable queue.
        """
        key = (topology, queue, parking_queue)
        declared_at = self._parking_at.get(key)
        if declared_at is not None and time.monotonic() - declared_at < PARKING_REDECLARE_INTERVAL:
            return
        running = self._parking_now.get(key)
        if running is not None:
            await asyncio.shield(running)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parking_now[key] = done
        try:
            spec = topology.parking_queue_spec(queue, parking_queue)
            await on_scratch_channel(
                connection, lambda ch: declare_queue(ch, spec, warned=self.warned)
            )
        except BaseException as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: waiters, if any, raise it themselves
            raise
        else:
            self._parking_at[key] = time.monotonic()
            done.set_result(None)
        finally:
            self._parking_now.pop(key, None)

    async def _once(
        self,
        key: tuple[object, ...],
        connection: aiormq.abc.AbstractConnection,
        action: Callable[[aiormq.abc.AbstractChannel], Awaitable[None]],
    ) -> None:
        await self._once_doing(key, lambda: on_scratch_channel(connection, action))

    async def _once_doing(
        self, key: tuple[object, ...], work: Callable[[], Awaitable[None]]
    ) -> None:
        """Run ``work`` for ``key`` once on this connection, however many ask at once."""
        if key in self._done:
            return
        async with self._lock:
            if key in self._done:
                return
            await work()
            self._done.add(key)

    async def topology(
        self, connection: aiormq.abc.AbstractConnection, topology: DelayTopology
    ) -> None:
        """Declare the chain, delivery, unroutable and parking exchanges and queues.

        Once per connection, and only when something is missing or different:
        a chain marked complete, with every exchange and queue in place (passive
        checks, :func:`~delayed_retry.amqp.chain_marker.chain_is_marked_complete`),
        is not declared again. After :meth:`forget` it is, in full.
        """
        if ("topology", topology) in self._done:  # every publish into the chain asks: stay cheap
            return

        async def declare_unless_complete() -> None:
            if (
                topology not in self._repair
                and markable(topology)
                and await chain_is_marked_complete(connection, topology)
            ):
                log.debug("delay topology %r is complete: nothing to declare", topology.prefix)
                log_memory_hint(connection, topology, tolerated=False)
                return
            await on_scratch_channel(
                connection, lambda ch: declare_in_full(ch, topology, warned=self.warned)
            )
            log.debug("declared delay topology %r (%d levels)", topology.prefix, topology.levels)
            self._repair.discard(topology)

        await self._once_doing(("topology", topology), declare_unless_complete)

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
            except aiormq.exceptions.ChannelNotFoundEntity as exc:
                if f"no exchange '{exchange}'" not in str(exc):
                    raise explain_refusal(
                        exc, f"queue {queue!r}", "a binding to the delivery exchange"
                    ) from exc
                # The chain was deleted under this connection: declare it again next time.
                self.forget(topology)
                raise NotFoundError(
                    f"the delivery exchange {exchange!r} of the delay chain {topology.prefix!r} "
                    f"is missing (deleted by hand, or by a teardown): {exc}. The chain is "
                    "declared again on the next try; if this repeats, find what deletes it"
                ) from exc
            except aiormq.exceptions.ChannelClosed as exc:
                raise explain_refusal(
                    exc, f"queue {queue!r}", "a binding to the delivery exchange"
                ) from exc
            if with_parking:
                parking = topology.parking_queue_spec(queue, parking_queue)
                await declare_queue(channel, parking, warned=self.warned)

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


async def declare_topology(
    channel: Any,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    *,
    queues: Iterable[str] = (),
    repair: bool = False,
) -> None:
    """Declare ``topology`` now, and bind ``queues`` to its end (with their parking queues).

    Optional: the decorator and :func:`~delayed_retry.publish_delayed` declare
    what they need on first use. Call it at start-up to fail fast on a
    mismatch. ``channel`` is an aio-pika or aiormq channel; the declarations
    are cached per connection, so calling it again costs nothing; a new
    connection that finds the chain complete and marked so declares none of it
    (see :mod:`delayed_retry.amqp.chain_marker`).

    ``repair=True`` declares every exchange, queue and binding now, even on a
    connection that declared them, even when the chain is marked complete: for
    a binding removed by hand, which no check over AMQP sees (the
    ``delayed-retry declare`` command does this).
    """
    underlay = await underlay_channel(channel)
    declarer = declarer_for(underlay.connection)
    if repair:
        declarer.forget(topology)
    await declarer.topology(underlay.connection, topology)
    for queue in queues:
        await declarer.destination(underlay.connection, topology, queue)
