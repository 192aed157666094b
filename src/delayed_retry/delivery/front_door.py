"""The front door: the delayed-message plugin's ``x-delay`` contract, on the delay chain.

While a front door for ``X`` runs, a message published to exchange ``X.delay`` with header
``x-delay`` (milliseconds) and routing key ``K`` is delivered to exchange ``X`` with key ``K``
after the delay, through the chain and the embedded
:class:`~delayed_retry.delivery.forwarder.Forwarder`; every hand-over is confirmed before the
ack. What each ``x-delay`` value does (missing, a numeric string, a fraction, garbage, too
long) and what the delivered copy carries is the contract in docs/delay-to-an-exchange.md,
"The front door: the plugin's contract".
"""

from __future__ import annotations

import logging
import math
import re
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any, Literal

from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from delayed_retry.amqp.chain import ToQueue, send_into_chain
from delayed_retry.amqp.channels import close_quietly, on_scratch_channel, underlay_connection
from delayed_retry.amqp.consumers import Consumer, consume_queue
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.consumer.handover import RequeueBackoff, hand_over, requeue_after_backoff
from delayed_retry.consumer.in_flight import InFlight
from delayed_retry.delivery.forwarder import Forwarder, ForwardingFailed
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import ConfigurationError, DelayedRetryError
from delayed_retry.headers.names import (
    X_DELAY,
    X_DUE_AT,
    X_FORWARD_ROUTING_KEY,
    X_ORIGINAL_EXCHANGE,
    X_ORIGINAL_ROUTING_KEY,
)
from delayed_retry.headers.values import sanitize_headers
from delayed_retry.recovery.hold import DEFAULT_HOLD, Hold

__all__ = [
    "BadDelay",
    "ExchangeType",
    "FrontDoor",
    "delay_exchange_name",
    "parse_x_delay",
]

log = logging.getLogger(__name__)


ExchangeType = Literal["direct", "topic", "fanout", "headers"]

_DIGITS = re.compile(r"\s*[+-]?\d{1,30}\s*")


class BadDelay(DelayedRetryError, ValueError):
    """An ``x-delay`` value that is not a delay; ``reason`` is the parking reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def parse_x_delay(value: object) -> int:
    """Milliseconds to wait for an ``x-delay`` value, 0 meaning now; raises :class:`BadDelay`.

    Reads it as the plugin does (an integer; missing or negative means now),
    and also accepts a string of decimal digits and a finite number, rounded up.
    """
    if value is None:
        return 0
    if isinstance(value, bool):
        raise BadDelay("bad-x-delay", f"{X_DELAY}={value!r} is a boolean, not milliseconds")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise BadDelay(
                "bad-x-delay", f"{X_DELAY}={value[:40]!r} is not a whole number of milliseconds"
            )
        return max(0, int(value))
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float | Decimal):
        if not math.isfinite(value):
            raise BadDelay("bad-x-delay", f"{X_DELAY}={value!r} is not a finite number")
        return max(0, math.ceil(value))
    raise BadDelay(
        "bad-x-delay", f"{X_DELAY} of type {type(value).__name__} is not a number of milliseconds"
    )


def delay_exchange_name(exchange: str) -> str:
    """The exchange producers publish delayed messages to: ``X.delay``."""
    return f"{exchange}.delay"


class FrontDoor:
    """Take ``x-delay`` messages from ``X.delay`` and deliver them to ``X`` after the delay.

    Use it to move producers off the delayed-message plugin, in any language:
    they change one exchange name. Embed it in a service with :meth:`start`
    and :meth:`close` (or ``async with``), or run ``delayed-retry front-door
    --exchange X``. Several may run at once; each message is delivered at
    least once. It declares ``X`` (of ``exchange_type``) when missing,
    ``X.delay``, the queue ``X.delay`` and its parking queue, and runs a
    :class:`~delayed_retry.delivery.forwarder.Forwarder` for ``X``. With ``hold`` (the
    default :data:`~delayed_retry.recovery.hold.DEFAULT_HOLD`) a message leaves the chain
    a few milliseconds early and the forwarder holds it until due; ``None``
    rounds delays up in the chain instead. Every forwarder of ``X`` must hold
    when front doors do.
    """

    def __init__(
        self,
        connection: AbstractConnection,
        *,
        exchange: str,
        exchange_type: ExchangeType = "topic",
        topology: DelayTopology = DEFAULT_TOPOLOGY,
        prefetch: int = 1000,
        publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
        hold: Hold | None = DEFAULT_HOLD,
    ) -> None:
        if not exchange or exchange.startswith("amq."):
            raise ConfigurationError(
                f"FrontDoor exchange={exchange!r} cannot take a front door: "
                "use a name of your own (not empty, not starting with 'amq.')"
            )
        if exchange_type not in ("direct", "topic", "fanout", "headers"):
            raise ConfigurationError(
                f"FrontDoor exchange_type={exchange_type!r} must be direct, topic, fanout "
                "or headers (the plugin exchange's x-delayed-type)"
            )
        self._connection = connection
        self.exchange = exchange
        self.exchange_type = exchange_type
        self.topology = topology
        self.delay_exchange = delay_exchange_name(exchange)
        self.inbox_queue = self.delay_exchange
        self.forward_queue = topology.forward_queue(exchange)
        self._prefetch = prefetch
        self._publish_timeout = publish_timeout
        self.forwarder = Forwarder(
            connection,
            exchanges=[exchange],
            topology=topology,
            prefetch=prefetch,
            publish_timeout=publish_timeout,
            hold=hold,
        )
        self._channel: AbstractChannel | None = None
        self._inbox: Consumer | None = None
        self.in_flight = InFlight()
        self._requeue_backoff = RequeueBackoff()
        self.accepted = 0
        self.given_back = 0

    async def __aenter__(self) -> FrontDoor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def declare(self) -> None:
        """Declare ``X`` (unless it exists, of whatever type), ``X.delay``, its queue and parking.

        An existing ``X`` is left as it is, so that during a migration the
        plugin exchange itself receives what the front door delivers. The
        inbox queue ``X.delay`` gets the delivery limit of every queue the
        library consumes (:data:`~delayed_retry.chain.topology.DELIVERY_LIMIT`); one
        that exists without it (declared by hand, by another tool, or by a
        checkout from before 0.1.0) is used as it is, with a warning.

        ``X.delay`` comes last, bound to its queue at once: a producer that
        publishes the moment it exists (as scripts waiting for the front door
        do) never meets an exchange that drops its message.
        """
        connection = await underlay_connection(self._connection)
        declarer = declarer_for(connection)
        try:
            await declarer.exchange_exists(connection, self.exchange)
        except ConfigurationError:
            await on_scratch_channel(
                connection,
                lambda ch: ch.exchange_declare(
                    self.exchange, exchange_type=self.exchange_type, durable=True
                ),
            )
        await declarer.topology(connection, self.topology)
        await declarer.parking(connection, self.topology, self.inbox_queue)
        # X.delay last, bound to its queue at once: producers publish to it as soon as
        # it exists, and a fanout exchange with no queue bound drops what it gets.
        await declarer.fanout_with_queue(
            connection, self.topology.inbox_queue_spec(self.delay_exchange)
        )

    async def start(self) -> None:
        """Declare what the contract needs, then consume ``X.delay`` and the forward queue."""
        await self.declare()
        await self.forwarder.start()
        self._channel = await self._connection.channel(publisher_confirms=False)
        await self._channel.set_qos(prefetch_count=self._prefetch)
        self._inbox = await consume_queue(self._channel, self.inbox_queue, self._on_delivery)
        log.info("front door open: %r -> %r", self.delay_exchange, self.exchange)

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        """Its consumers: of ``X.delay``, then its forwarder's of the forward queue."""
        own = (self._inbox,) if self._inbox is not None else ()
        return own + self.forwarder.consumers

    @property
    def consuming(self) -> bool:
        """Whether the broker has its consumers of ``X.delay`` and the forward queue now."""
        return self._inbox is not None and self._inbox.in_place and self.forwarder.consuming

    async def close(self, *, grace: float = 0.0) -> None:
        """Stop consuming; unacked messages go back to their queues.

        ``grace``: seconds to let hand-overs in flight finish (confirmed, then
        acked) before the channels close; see :meth:`Forwarder.close`.
        """
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            await inbox.cancel()
        await self.forwarder.stop_consuming()
        started = time.monotonic()
        await self.in_flight.wait_idle(grace)
        await self.forwarder.close(grace=max(0.0, grace - (time.monotonic() - started)))
        await close_quietly(self._channel)

    async def _on_delivery(self, message: AbstractIncomingMessage) -> None:
        with self.in_flight.track():
            await self.on_message(message)

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Hand one ``x-delay`` message on: into the chain, to ``X`` now, or to parking.

        Every way on goes through the one hand-over: the message is acked only
        once its next home confirmed it, and stays unacked (tried again with a
        growing pause) while that fails. A failure of the front door itself
        gives it back after a pause: never lost, never spinning.
        """
        try:
            await self._on_message(message)
        except Exception as exc:
            log.exception("front door failed on message %s", message.message_id)
            await requeue_after_backoff(message, self.inbox_queue, exc, self._requeue_backoff)
        else:
            self._requeue_backoff.reset()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        key = message.routing_key or ""
        headers = message.headers or {}
        start = utcnow()
        try:
            delay_ms = parse_x_delay(headers.get(X_DELAY))
            if delay_ms > self.topology.max_delay // timedelta(milliseconds=1):
                raise BadDelay(
                    "delay-too-long",
                    f"{X_DELAY}={delay_ms} ms is longer than the chain holds "
                    f"({self.topology.max_delay}); add levels to the topology",
                )
        except BadDelay as exc:
            await self.forwarder.settle_by_parking(
                message,
                queue=self.inbox_queue,
                exchange=self.exchange,
                routing_key=key,
                error=ForwardingFailed(exc.reason, str(exc)),
            )
            return
        out: dict[str, Any] = sanitize_headers(headers)
        out[X_DELAY] = -delay_ms
        # Records of where every copy was sent, delivered at once or after a delay.
        out.setdefault(X_ORIGINAL_EXCHANGE, self.exchange)
        out.setdefault(X_ORIGINAL_ROUTING_KEY, key)
        if not delay_ms:
            await self.forwarder.deliver(
                message,
                exchange=self.exchange,
                routing_key=key,
                headers=out,
                queue=self.forward_queue,
            )
            return
        due_at = start + timedelta(milliseconds=delay_ms)
        out[X_DUE_AT] = to_epoch_ms(due_at)
        out[X_FORWARD_ROUTING_KEY] = key

        async def into_chain() -> bool:
            # Out of the chain a lead early when forwarders hold messages until due;
            # computed at each try, so a later try waits less in the chain.
            await send_into_chain(
                await self.forwarder.publish_channel(),
                message,
                topology=self.topology,
                to=ToQueue(self.forward_queue, declare=False),
                due_at=due_at,
                hold=self.forwarder.hold,
                headers=out,
                timeout=self._publish_timeout,
                keep_delivery_mode=True,
            )
            return True

        if await hand_over(message, into_chain, queue=self.inbox_queue) is not None:
            self.accepted += 1
        else:
            self.given_back += 1
