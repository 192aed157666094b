"""Delay to an exchange and routing key: the forward queue and the forwarder.

Dead-lettering cannot rewrite a routing key, so a delay to exchange ``X`` with key ``K`` ends
in queue ``<prefix>.forward.X``, from which a :class:`Forwarder` publishes each message to
``X`` with the key the message carries
(:data:`~delayed_retry.headers.names.X_FORWARD_ROUTING_KEY`): confirm, then ack, through the
one hand-over. What it cannot deliver is parked in ``<prefix>.forward.X.parking``, never
dropped. The flow and its failure cases: docs/delay-to-an-exchange.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import aiormq
import aiormq.abc
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from delayed_retry.amqp.chain import ToQueue, send_into_chain
from delayed_retry.amqp.channels import close_quietly, exchange_exists, underlay_connection
from delayed_retry.amqp.consumers import Consumer, all_in_place, consume_queue
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT, publish_copy
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.consumer.handover import RequeueBackoff, hand_over, requeue_after_backoff
from delayed_retry.consumer.hold import HeldUntilDue, hold_until_due
from delayed_retry.consumer.in_flight import InFlight
from delayed_retry.durations import utcnow
from delayed_retry.errors import ConfigurationError, DelayedRetryError, PublishError
from delayed_retry.headers.names import (
    X_FORWARD_ROUTING_KEY,
    X_ORIGINAL_EXCHANGE,
    X_ORIGINAL_ROUTING_KEY,
)
from delayed_retry.headers.parking_record import parking_headers
from delayed_retry.headers.retry_state import forwarded_headers, parse_retry_state
from delayed_retry.headers.values import sanitize_headers
from delayed_retry.recovery.hold import DEFAULT_HOLD, Hold, check_hold

__all__ = ["Forwarder", "ForwardingFailed"]

log = logging.getLogger(__name__)


class ForwardingFailed(DelayedRetryError):
    """A forward the broker will not take; ``reason`` says why (``exchange-missing``, …).

    Recorded as the exception of the parking record of a message that could
    not be delivered.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class Forwarder:
    """Consume forward queues and deliver each message to its exchange: confirm, then ack.

    Run at least one wherever :func:`~delayed_retry.publish_delayed` sends to an exchange
    (``delayed-retry forwarder`` runs one; the front door embeds one); several may share a
    queue. Use :meth:`start` and :meth:`close`, or ``async with``. ``hold`` (default
    :data:`~delayed_retry.recovery.hold.DEFAULT_HOLD`) holds a message that left the chain a
    little early until it is due; ``None`` sends it back into the chain instead. Keep
    ``prefetch`` above rate x ``hold.limit``. Counters: ``forwarded``, ``parked``,
    ``given_back``.
    """

    def __init__(
        self,
        connection: AbstractConnection,
        *,
        exchanges: Sequence[str],
        topology: DelayTopology = DEFAULT_TOPOLOGY,
        prefetch: int = 1000,
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
        self._held = HeldUntilDue()
        self._requeue_backoff = RequeueBackoff()
        self._consume: AbstractChannel | None = None
        self._consumers: list[Consumer] = []
        self.in_flight = InFlight()
        self._publish: AbstractChannel | None = None
        self._publish_lock = asyncio.Lock()
        self.forwarded = 0
        self.parked = 0
        self.given_back = 0

    async def __aenter__(self) -> Forwarder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Declare the forward queues (and their parking) and start consuming them."""
        connection = await underlay_connection(self._connection)
        declarer = declarer_for(connection)
        queues = [
            await declarer.forward_queue(connection, self.topology, exchange)
            for exchange in self.exchanges
        ]
        self._consume = await self._connection.channel(publisher_confirms=False)
        await self._consume.set_qos(prefetch_count=self._prefetch)
        for exchange, name in zip(self.exchanges, queues, strict=True):
            self._consumers.append(
                await consume_queue(self._consume, name, self._handler(exchange, name))
            )
        log.info(
            "forwarding %s",
            ", ".join(f"{q} -> {x!r}" for q, x in zip(queues, self.exchanges, strict=True)),
        )

    @property
    def held_until_due(self) -> int:
        """Messages it holds right now because they left the chain a little early."""
        return len(self._held)

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        """Its consumers, one per forward queue."""
        return tuple(self._consumers)

    @property
    def consuming(self) -> bool:
        """Whether the broker has each of its consumers now (false while they are restored)."""
        return all_in_place(self._consumers)

    async def missing_exchanges(self) -> list[str]:
        """The exchanges it forwards to that do not exist now (a passive declare of each).

        While one is missing, every message that comes due for it is parked:
        a readiness probe should say so. Raises when the broker cannot be asked.
        """
        return [x for x in self.exchanges if not await exchange_exists(self._connection, x)]

    async def stop_consuming(self) -> None:
        """Cancel its consumers and give back what it holds until due; forwards in flight go on."""
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            await consumer.cancel()
        self._held.release()

    async def close(self, *, grace: float = 0.0) -> None:
        """Stop consuming; messages waiting until due and other unacked ones go back.

        ``grace``: seconds to let forwards in flight finish (their confirms
        arrive and they are acked) before the channels close; what is still
        in flight then goes back to its queue and is delivered again later.
        """
        await self.stop_consuming()
        await self.in_flight.wait_idle(grace)
        self._held.release()
        await close_quietly(self._consume)
        await close_quietly(self._publish)

    def _handler(self, exchange: str, queue: str) -> Any:
        async def on_message(message: AbstractIncomingMessage) -> None:
            with self.in_flight.track():
                await self.forward(message, exchange=exchange, queue=queue)

        return on_message

    async def publish_channel(self) -> aiormq.abc.AbstractChannel:
        """A confirm-mode channel for forwarding, reopened after the broker closed it."""
        async with self._publish_lock:
            if self._publish is None or self._publish.is_closed:
                self._publish = await self._connection.channel(publisher_confirms=True)
            underlay: aiormq.abc.AbstractChannel = await self._publish.get_underlay_channel()
            return underlay

    async def forward(self, message: AbstractIncomingMessage, *, exchange: str, queue: str) -> None:
        """Deliver one message of forward queue ``queue`` to ``exchange``, or park it; then ack.

        A failure of the forwarder itself (not of a publish) gives the message
        back after a growing pause: never lost, never spinning.
        """
        try:
            await self._forward(message, exchange=exchange, queue=queue)
        except Exception as exc:
            log.exception("forwarder failed on message %s of %r", message.message_id, queue)
            self.given_back += 1
            await requeue_after_backoff(message, queue, exc, self._requeue_backoff)
        else:
            self._requeue_backoff.reset()

    async def _forward(
        self, message: AbstractIncomingMessage, *, exchange: str, queue: str
    ) -> None:
        if not await self._until_due(message, queue):
            return
        key = message.headers.get(X_FORWARD_ROUTING_KEY) if message.headers else None
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        if not isinstance(key, str):
            await self.settle_by_parking(
                message,
                queue=queue,
                exchange=exchange,
                routing_key="",
                error=ForwardingFailed(
                    "no-routing-key", f"message in {queue!r} has no {X_FORWARD_ROUTING_KEY} header"
                ),
            )
            return
        await self.deliver(
            message,
            exchange=exchange,
            routing_key=key,
            headers=forwarded_headers(message.headers),
            queue=queue,
        )

    async def _until_due(self, message: AbstractIncomingMessage, queue: str) -> bool:
        """Hold an early message until due; ``False`` when it went back (chain or queue)."""
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

        # Too early to hold: back into the chain for the rest of the wait.
        async def redelay() -> bool:
            await send_into_chain(
                await self.publish_channel(),
                message,
                topology=self.topology,
                to=ToQueue(queue, declare=False),
                due_at=due_at,
                hold=self.hold,
                early=True,
                headers=sanitize_headers(message.headers),
                timeout=self._publish_timeout,
                keep_delivery_mode=True,
            )
            return True

        await self._hand_over(message, redelay, queue=queue)
        return False

    async def deliver(
        self,
        message: AbstractIncomingMessage,
        *,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any],
        queue: str,
    ) -> None:
        """Publish a copy to ``exchange`` (confirmed), else park it if it can never go; then ack.

        ``queue`` is the queue ``message`` was consumed from: its parking queue
        gets what cannot be delivered. A failure that may pass (a queue refusing
        publishes, a timeout, a lost channel) is tried again by the hand-over.
        """

        async def attempt() -> bool:
            try:
                await publish_copy(
                    await self.publish_channel(),
                    message,
                    exchange=exchange,
                    routing_key=routing_key,
                    headers=headers,
                    timeout=self._publish_timeout,
                    # The producer's own destination: a transient message arrives transient.
                    keep_delivery_mode=True,
                )
                return True
            except PublishError as exc:
                reason = await self._why_not(exchange, exc)
                if reason is None:
                    raise
                failure = ForwardingFailed(reason, str(exc))
            await self._park(
                message, queue=queue, exchange=exchange, routing_key=routing_key, error=failure
            )
            return False

        forwarded = await self._hand_over(message, attempt, queue=queue)
        if forwarded is True:
            self.forwarded += 1
        elif forwarded is False:
            self.parked += 1

    async def _why_not(self, exchange: str, exc: PublishError) -> str | None:
        """The parking reason of a failed forward that no retry can fix, else ``None``."""
        try:
            connection = await underlay_connection(self._connection)
            await declarer_for(connection).exchange_exists(connection, exchange)
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
        queue: str,
        exchange: str,
        routing_key: str,
        error: Exception,
    ) -> None:
        """Park ``message`` with a record in ``queue``'s parking queue (confirmed), then ack it."""

        async def park() -> bool:
            await self._park(
                message, queue=queue, exchange=exchange, routing_key=routing_key, error=error
            )
            return True

        if await self._hand_over(message, park, queue=queue) is not None:
            self.parked += 1

    async def _hand_over(
        self, message: AbstractIncomingMessage, publish: Any, *, queue: str
    ) -> Any | None:
        result = await hand_over(message, publish, queue=queue)
        if result is None:
            self.given_back += 1
        return result

    async def _park(
        self,
        message: AbstractIncomingMessage,
        *,
        queue: str,
        exchange: str,
        routing_key: str,
        error: Exception,
    ) -> None:
        reason = error.reason if isinstance(error, ForwardingFailed) else "not-deliverable"
        state = dataclasses.replace(
            parse_retry_state(
                message.headers, exchange=exchange, routing_key=routing_key, queue=queue
            ),
            original_exchange=exchange,
            original_routing_key=routing_key,
        )
        headers = parking_headers(message.headers, state, error, now=utcnow(), reason=reason)
        headers[X_ORIGINAL_EXCHANGE] = exchange
        headers[X_ORIGINAL_ROUTING_KEY] = routing_key
        channel = await self.publish_channel()
        connection = channel.connection
        await declarer_for(connection).parking(connection, self.topology, queue)
        await publish_copy(
            channel,
            message,
            exchange=self.topology.parking_exchange,
            routing_key=queue,
            headers=headers,
            timeout=self._publish_timeout,
        )
        log.warning("parked a message of %r (%s): %s", queue, reason, error)
