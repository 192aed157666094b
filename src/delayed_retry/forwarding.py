"""Delay to an exchange and routing key: the forward queue and the forwarder.

Dead-lettering cannot rewrite a routing key, so a delay whose destination is
an exchange ``X`` with key ``K`` (the delayed-message plugin's model) takes one
process step at the end of the chain::

    publish_delayed(exchange=X, routing_key=K) ──► chain ──► queue <prefix>.forward.X
        ──► Forwarder ──(confirm, then ack)──► X with key K ──► every bound queue

The exchange is fixed by the forward queue (configuration), only the routing
key comes from the message (header :data:`X_FORWARD_ROUTING_KEY`). A message
the forwarder cannot deliver (``X`` deleted while it waited, or nothing bound
to ``K``) is parked with a record in ``<prefix>.forward.X.parking``, never
dropped. Several forwarders may consume one forward queue: each message is
forwarded at least once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import aio_pika
import aiormq
import aiormq.abc
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from delayed_retry.declare import declare_parking_queue, declarer_for
from delayed_retry.durations import utcnow
from delayed_retry.errors import ConfigurationError, PublishError
from delayed_retry.headers import (
    X_DUE_AT,
    X_ORIGINAL_EXCHANGE,
    X_ORIGINAL_ROUTING_KEY,
    parking_headers,
    parse_retry_state,
    sanitize_headers,
)
from delayed_retry.hold import DEFAULT_HOLD, Hold, chain_units, check_hold
from delayed_retry.holding import HeldMessages, hold_until_due
from delayed_retry.publishing import DEFAULT_PUBLISH_TIMEOUT, publish_copy
from delayed_retry.topology import DEFAULT_TOPOLOGY, DelayTopology

__all__ = [
    "X_FORWARD_ROUTING_KEY",
    "Forwarder",
    "ForwardingFailed",
    "check_exchange_exists",
    "declare_forward_queue",
    "forward_queue_name",
    "forwarded_headers",
]

log = logging.getLogger(__name__)

X_FORWARD_ROUTING_KEY = "x-retry-forward-routing-key"
"""The routing key a message in a forward queue is delivered with."""

EXISTS_CACHE_SECONDS = 1.0
"""How long ``publish_delayed`` trusts that an exchange it checked still exists."""

REDELIVER_PAUSE = 1.0
"""Seconds to wait before handing back a message whose forward failed for a passing reason."""


class ForwardingFailed(Exception):
    """A forward the broker did not take; ``reason`` says why (``exchange-missing``, …)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def forward_queue_name(topology: DelayTopology, exchange: str) -> str:
    """The queue at the end of the chain holding delays for ``exchange``."""
    if not exchange:
        raise ConfigurationError(
            "exchange='' (the default exchange) cannot be a delay destination; "
            "pass queue=NAME to publish_delayed instead"
        )
    name = f"{topology.prefix}.forward.{exchange}"
    topology.check_destination(name)
    return name


def forwarded_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers of the message as delivered to its exchange: without the chain's own."""
    out = sanitize_headers(headers)
    out.pop(X_DUE_AT, None)
    out.pop(X_FORWARD_ROUTING_KEY, None)
    return out


_checking: weakref.WeakKeyDictionary[aiormq.abc.AbstractConnection, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)
_seen: weakref.WeakKeyDictionary[aiormq.abc.AbstractConnection, dict[str, float]] = (
    weakref.WeakKeyDictionary()
)


async def check_exchange_exists(
    connection: aiormq.abc.AbstractConnection, exchange: str, *, cache: float = 0.0
) -> None:
    """Raise :class:`ConfigurationError` naming ``exchange`` when it does not exist.

    ``cache`` seconds: trust a check this recent on the same connection (an
    exchange deleted in between is caught by the forwarder, which parks).
    """
    seen = _seen.setdefault(connection, {})
    if cache and time.monotonic() - seen.get(exchange, -math.inf) < cache:
        return
    # One check in flight per connection and exchange: a burst of calls shares it.
    lock = _checking.setdefault(connection, {}).setdefault(exchange, asyncio.Lock())
    async with lock:
        if cache and time.monotonic() - seen.get(exchange, -math.inf) < cache:
            return
        await _check(connection, exchange)
        seen[exchange] = time.monotonic()


async def _check(connection: aiormq.abc.AbstractConnection, exchange: str) -> None:
    channel = await connection.channel(publisher_confirms=False)
    try:
        await channel.exchange_declare(exchange, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise ConfigurationError(
            f"exchange {exchange!r} does not exist, so nothing could be delivered to it; "
            "declare it (with its bindings) before scheduling messages for it"
        ) from exc
    finally:
        if not channel.is_closed:
            await channel.close()


async def declare_forward_queue(
    connection: aiormq.abc.AbstractConnection, topology: DelayTopology, exchange: str
) -> str:
    """Declare ``exchange``'s forward queue, bound to the chain's end, and its parking queue."""
    name = forward_queue_name(topology, exchange)
    declarer = declarer_for(connection)
    await declarer.topology(connection, topology)

    async def action(channel: aiormq.abc.AbstractChannel) -> None:
        await channel.queue_declare(
            name, durable=True, arguments={"x-queue-type": topology.queue_type}
        )

    # Once per connection: a retry returning to an exchange comes through here each time.
    await declarer._once(("forward-queue", topology, name), connection, action)
    await declarer.destination(connection, topology, name, with_parking=False)
    await declarer._once(
        ("forward-parking", topology, name),
        connection,
        lambda ch: declare_parking_queue(connection, topology, name),
    )
    return name


class Forwarder:
    """Consume forward queues and deliver each message to its exchange: confirm, then ack.

    Run at least one wherever :func:`~delayed_retry.publish_delayed` sends to
    an exchange (the ``delayed-retry forwarder`` command runs one; the front
    door embeds one). Several may run on one queue to share the load; a crash
    between the confirm and the ack delivers that message twice, never zero
    times. Use :meth:`start` and :meth:`close`, or ``async with``.

    ``hold`` (default :data:`~delayed_retry.hold.DEFAULT_HOLD`): a message that
    left the chain a little before its due time (``publish_delayed(...,
    hold=...)``, the front door) is held until due, then forwarded; one more
    than ``hold.limit`` early goes back into the chain. ``None`` forwards
    what arrives at once.
    """

    def __init__(
        self,
        connection: AbstractConnection,
        *,
        exchanges: Sequence[str],
        topology: DelayTopology = DEFAULT_TOPOLOGY,
        prefetch: int = 100,
        publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
        hold: Hold | None = DEFAULT_HOLD,
    ) -> None:
        check_hold(hold, topology, name="Forwarder hold")
        if isinstance(exchanges, str) or not exchanges:
            raise ConfigurationError(
                f"Forwarder exchanges={exchanges!r} must be a non-empty list of exchange names"
            )
        if prefetch < 1:
            raise ConfigurationError(f"Forwarder prefetch={prefetch} must be at least 1")
        self._connection = connection
        self.exchanges = tuple(exchanges)
        self.topology = topology
        self._prefetch = prefetch
        self._publish_timeout = publish_timeout
        self.hold = hold
        self._held = HeldMessages()
        self._consume: AbstractChannel | None = None
        self._publish: AbstractChannel | None = None
        self._publish_lock = asyncio.Lock()
        self.forwarded = 0
        self.parked = 0

    async def __aenter__(self) -> Forwarder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _underlay(self) -> aiormq.abc.AbstractConnection:
        channel = await self._connection.channel(publisher_confirms=False)
        try:
            underlay = await channel.get_underlay_channel()
            return underlay.connection
        finally:
            await channel.close()

    async def start(self) -> None:
        """Declare the forward queues (and their parking) and start consuming them."""
        connection = await self._underlay()
        queues = [
            await declare_forward_queue(connection, self.topology, exchange)
            for exchange in self.exchanges
        ]
        self._consume = await self._connection.channel(publisher_confirms=False)
        await self._consume.set_qos(prefetch_count=self._prefetch)
        for exchange, name in zip(self.exchanges, queues, strict=True):
            queue = await self._consume.get_queue(name, ensure=False)
            await queue.consume(self._handler(exchange, name))
        log.info(
            "forwarding %s",
            ", ".join(f"{q} -> {x!r}" for q, x in zip(queues, self.exchanges, strict=True)),
        )

    async def close(self) -> None:
        """Stop consuming; held and other unacked messages go back to their queue."""
        self._held.release()
        for channel in (self._consume, self._publish):
            if channel is not None and not channel.is_closed:
                await channel.close()

    def _handler(self, exchange: str, queue: str) -> Any:
        async def on_message(message: AbstractIncomingMessage) -> None:
            await self.forward(message, exchange=exchange, park_queue=queue)

        return on_message

    async def publish_channel(self) -> aiormq.abc.AbstractChannel:
        """A confirm-mode channel for forwarding, reopened after the broker closed it."""
        async with self._publish_lock:
            if self._publish is None or self._publish.is_closed:
                self._publish = await self._connection.channel(publisher_confirms=True)
            underlay: aiormq.abc.AbstractChannel = await self._publish.get_underlay_channel()
            return underlay

    async def forward(
        self, message: AbstractIncomingMessage, *, exchange: str, park_queue: str
    ) -> None:
        """Deliver one message of a forward queue to ``exchange``, or park it; then ack."""
        if self.hold is not None and not await self._until_due(message, park_queue):
            return
        key = message.headers.get(X_FORWARD_ROUTING_KEY) if message.headers else None
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        if not isinstance(key, str):
            await self.settle_by_parking(
                message,
                park_queue=park_queue,
                exchange=exchange,
                routing_key="",
                error=ForwardingFailed(
                    "no-routing-key",
                    f"message in {park_queue!r} has no {X_FORWARD_ROUTING_KEY} header",
                ),
            )
            return
        await self.deliver(
            message,
            exchange=exchange,
            routing_key=key,
            headers=forwarded_headers(message.headers),
            park_queue=park_queue,
        )

    async def _until_due(self, message: AbstractIncomingMessage, queue: str) -> bool:
        """Hold an early message until due; ``False`` when it went back (chain or queue)."""
        assert self.hold is not None
        due_at = parse_retry_state(
            message.headers, exchange=message.exchange, routing_key=message.routing_key, queue=queue
        ).due_at
        if due_at is None:
            return True
        outcome = await hold_until_due(
            self._held, self.hold, message, due_at, max_delay=self.topology.max_delay
        )
        if outcome != "early":
            return outcome == "due"
        # More than the hold's limit early: back into the chain for the rest of the wait.
        units = chain_units(self.topology, due_at, now=utcnow(), hold=self.hold)
        route = self.topology.route(units, queue)
        try:
            await publish_copy(
                await self.publish_channel(),
                message,
                exchange=route.exchange,
                routing_key=route.routing_key,
                headers=sanitize_headers(message.headers),
                timeout=self._publish_timeout,
            )
        except PublishError as exc:
            log.warning("could not send an early message back into the chain (%s)", exc)
            await asyncio.sleep(REDELIVER_PAUSE)
            await message.nack(requeue=True)
            return False
        await message.ack()
        return False

    async def deliver(
        self,
        message: AbstractIncomingMessage,
        *,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any],
        park_queue: str,
    ) -> None:
        """Publish a copy to ``exchange`` (confirmed), parking it if it cannot go; then ack.

        A failure that may pass (a timeout, a lost connection) hands the
        message back to its queue for another try instead.
        """
        try:
            await publish_copy(
                await self.publish_channel(),
                message,
                exchange=exchange,
                routing_key=routing_key,
                headers=headers,
                timeout=self._publish_timeout,
            )
        except PublishError as exc:
            reason = await self._why_not(exchange, exc)
            if reason is None:
                log.warning("forward to %r failed, handing back: %s", exchange, exc)
                await asyncio.sleep(REDELIVER_PAUSE)
                await message.nack(requeue=True)
                return
            await self.settle_by_parking(
                message,
                park_queue=park_queue,
                exchange=exchange,
                routing_key=routing_key,
                error=ForwardingFailed(reason, str(exc)),
            )
            return
        await message.ack()
        self.forwarded += 1

    async def _why_not(self, exchange: str, exc: PublishError) -> str | None:
        try:
            await check_exchange_exists(await self._underlay(), exchange)
        except ConfigurationError:
            return "exchange-missing"
        except (aiormq.exceptions.AMQPError, ConnectionError):
            return None
        if "unroutable" in str(exc):
            return "unroutable"
        return None

    async def settle_by_parking(
        self,
        message: AbstractIncomingMessage,
        *,
        park_queue: str,
        exchange: str,
        routing_key: str,
        error: Exception,
    ) -> None:
        """Park ``message`` with a record under ``park_queue`` (confirmed), then ack it."""
        reason = error.reason if isinstance(error, ForwardingFailed) else "not-deliverable"
        state = dataclasses.replace(
            parse_retry_state(
                message.headers, exchange=exchange, routing_key=routing_key, queue=park_queue
            ),
            original_exchange=exchange,
            original_routing_key=routing_key,
        )
        headers = parking_headers(message.headers, state, error, now=utcnow(), reason=reason)
        headers[X_ORIGINAL_EXCHANGE] = exchange
        headers[X_ORIGINAL_ROUTING_KEY] = routing_key
        try:
            await publish_copy(
                await self.publish_channel(),
                message,
                exchange=self.topology.parking_exchange,
                routing_key=park_queue,
                headers=headers,
                timeout=self._publish_timeout,
            )
        except PublishError as exc:
            log.error("parking a message of %r failed, handing it back: %s", park_queue, exc)
            await asyncio.sleep(REDELIVER_PAUSE)
            await message.nack(requeue=True)
            return
        log.warning("parked a message of %r (%s): %s", park_queue, reason, error)
        await message.ack()
        self.parked += 1


async def open_forwarder(
    url: str, *, exchanges: Sequence[str], topology: DelayTopology = DEFAULT_TOPOLOGY
) -> tuple[AbstractConnection, Forwarder]:
    """Connect to ``url`` and start a :class:`Forwarder` there (for the command line)."""
    connection = await aio_pika.connect_robust(url)
    forwarder = Forwarder(connection, exchanges=exchanges, topology=topology)
    await forwarder.start()
    return connection, forwarder
