"""Hand a failed message over to its next home, then ack the original.

Order of operations, which is what makes it at-least-once: the copy is
published (into the delay chain, or to parking) on the consumer's channel with
publisher confirms; only after the confirm is the original acked. If the
process dies in between, the original is redelivered and the copy also
arrives: a duplicate, never a loss. If the hand-over is not confirmed (a nack,
a timeout, a channel error), the original stays unacked while the publish is
tried again with backoff for up to :data:`HANDOVER_RETRY_WINDOW` seconds, and
only then is it returned to its queue (``nack`` with requeue); the consumer
goes on with other messages meanwhile. See ``docs/reliability.md``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

import aiormq
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import publishing
from delayed_retry.declare import declarer_for
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import DelayOutOfRangeError, PublishError
from delayed_retry.forwarding import (
    X_FORWARD_ROUTING_KEY,
    declare_forward_queue,
    forward_queue_name,
)
from delayed_retry.headers import (
    X_DUE_AT,
    RetryState,
    failure_headers,
    parking_headers,
    sanitize_headers,
)
from delayed_retry.hold import Hold, chain_units
from delayed_retry.observability.instrumentation import AttemptScope
from delayed_retry.policy import Decision
from delayed_retry.topology import DelayTopology

__all__ = ["HANDOVER_RETRY_WINDOW", "HandOver", "Trouble", "ack", "channel_open", "give_back"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

HANDOVER_RETRY_WINDOW = 30.0
"""Seconds a failed hand-over is tried again, original unacked, before it is requeued."""
HANDOVER_FIRST_PAUSE = 0.5
HANDOVER_MAX_PAUSE = 8.0
REQUEUE_FIRST_PAUSE = 0.5
"""Seconds a message is held before it is given back after the first internal failure."""
REQUEUE_MAX_PAUSE = 30.0
"""The longest such pause; it doubles with each message given back in a row."""


@dataclass(eq=False)
class Trouble:
    """Messages given back in a row without a handling in between: sets the next pause."""

    given_back: int = 0

    def clear(self) -> None:
        self.given_back = 0

    def next_pause(self) -> float:
        pause = min(REQUEUE_FIRST_PAUSE * 2.0 ** min(self.given_back, 30), REQUEUE_MAX_PAUSE)
        self.given_back += 1
        return pause


@dataclass(frozen=True, kw_only=True)
class HandOver:
    """Where and how the failed messages of one queue are handed over."""

    queue: str
    topology: DelayTopology
    parking_queue: str | None
    publish_timeout: float
    trouble: Trouble = field(default_factory=Trouble)
    return_to: Literal["queue", "exchange"] = "queue"
    hold: Hold | None = None
    """Retries to the queue leave the chain early by this hold's lead; the handler holds them."""
    consumed_from_queue: bool = True
    """Whether the failed messages come from ``queue`` itself (a consumer, not the router).

    Only then does a retry due at once go straight back to ``queue``: its unacked
    original proves the queue exists, and a deleted queue took its messages with it.
    A message handed over from elsewhere keeps the chain route, whose alternate
    exchange keeps it in the unroutable queue if ``queue`` was deleted.
    """

    async def forward(
        self,
        message: AbstractIncomingMessage,
        *,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any],
    ) -> None:
        """Publish a copy of ``message`` with ``headers``; return once the broker confirmed it."""
        await publishing.publish_copy(
            message.channel,
            message,
            exchange=exchange,
            routing_key=routing_key,
            headers=headers,
            timeout=self.publish_timeout,
        )

    async def redelay(self, message: AbstractIncomingMessage, due_at: datetime) -> None:
        """Send a message that arrived before its due time back for the rest of its wait."""

        async def publish() -> bool:
            now = utcnow()
            units = chain_units(self.topology, due_at, now=now, hold=self.hold)
            route = self.topology.route(units, self.queue)
            await self.forward(
                message,
                exchange=route.exchange,
                routing_key=route.routing_key,
                headers=sanitize_headers(message.headers),
            )
            return True

        # Requeueing at once after a failed re-publish would spin the early message.
        if await self._keep_trying(message, publish) is not None:
            await ack(message, self.queue)

    async def _keep_trying(
        self, message: AbstractIncomingMessage, publish: Callable[[], Awaitable[_T]]
    ) -> _T | None:
        """Run ``publish`` until it is confirmed, with pauses; give the message back if never.

        Requeueing an unconfirmed hand-over at once would spin, and every requeue counts
        toward a quorum queue's delivery limit: try again while the channel is open.
        Returns ``None`` after giving the message back.
        """
        started = time.monotonic()
        pause = HANDOVER_FIRST_PAUSE
        while True:
            try:
                return await publish()
            except (PublishError, aiormq.exceptions.AMQPError, ConnectionError) as err:
                elapsed = time.monotonic() - started
                if not channel_open(message) or elapsed + pause > HANDOVER_RETRY_WINDOW:
                    await give_back(message, self.queue, err)
                    return None
                log.warning(
                    "hand-over of message %s from queue %r was not confirmed (%s); "
                    "keeping it unacked and trying again in %.1f s",
                    message.message_id,
                    self.queue,
                    err,
                    pause,
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, HANDOVER_MAX_PAUSE)

    async def park_now(
        self, message: AbstractIncomingMessage, state: RetryState, exc: BaseException, reason: str
    ) -> None:
        """Park ``message`` for ``reason`` (one attempt, raising if not confirmed), then ack it."""
        from delayed_retry.observability.instrumentation import NoInstrumentation

        with NoInstrumentation().attempt(message, state, queue=self.queue) as scope:
            await self._park(message, state, exc, reason, scope, utcnow())
        await ack(message, self.queue)

    async def give_back_later(self, message: AbstractIncomingMessage, err: BaseException) -> None:
        """Hold ``message`` for a backoff pause, then return it to its queue (nack, requeue).

        For failures the message cannot fix (a broker refusing declarations, a
        channel without confirms): the consumer keeps going, and the pause keeps
        a queue of such messages from spinning.
        """
        pause = self.trouble.next_pause()
        log.error(
            "message %s from queue %r could not be handled or parked (%r); returning it "
            "to the queue in %.1f s",
            message.message_id,
            self.queue,
            err,
            pause,
        )
        await asyncio.sleep(pause)
        await give_back(message, self.queue, err)

    async def failed(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: Exception,
        decision: Decision,
        scope: AttemptScope,
    ) -> None:
        """Carry out ``decision`` for a message whose handler raised ``exc``, then ack it."""
        carried_out = await self._keep_trying(
            message, lambda: self._publish_copy(message, state, exc, decision, scope)
        )
        if carried_out is None:
            scope.finish("error", exc=exc)
            return
        decision = carried_out
        await ack(message, self.queue)
        if decision.action == "retry":
            scope.finish("retry", delay=decision.delay, exc=exc)
        else:
            scope.finish("parked", exc=exc, reason=decision.reason)

    async def _publish_copy(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: Exception,
        decision: Decision,
        scope: AttemptScope,
    ) -> Decision:
        """Publish the retry copy or the parking record; return the decision carried out."""
        now = utcnow()
        if decision.action == "retry":
            decision = await self._retry(message, state, exc, decision, scope, now)
        if decision.action == "park":
            assert decision.reason is not None
            await self._park(message, state, exc, decision.reason, scope, now)
        return decision

    async def _retry(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: Exception,
        decision: Decision,
        scope: AttemptScope,
        now: datetime,
    ) -> Decision:
        target, forward_key = await self._retry_target(message)
        try:
            due_at = now + timedelta(seconds=decision.delay)
            # Handlers and forwarders hold a message that leaves the chain early until due.
            units = chain_units(self.topology, due_at, now=now, hold=self.hold)
            route = self.topology.route(units, target)
        except (DelayOutOfRangeError, OverflowError):
            return Decision.park("delay-out-of-range")
        exchange, routing_key = route.exchange, route.routing_key
        if forward_key is None and self.consumed_from_queue and due_at <= now:
            # Due already (zero delay): straight back to the queue through the default
            # exchange, as a hand-rolled retry does, instead of through two topic exchanges
            # on a long key. Never early: nothing waits. The queue holds the unacked
            # original, so it exists; if it is deleted meanwhile, the mandatory publish is
            # returned and the original stays unacked (nothing to catch in the unroutable
            # queue: the queue's own messages went with it).
            exchange, routing_key = "", target
        headers = failure_headers(message.headers, state, exc, now=now, retries=state.retries + 1)
        headers[X_DUE_AT] = to_epoch_ms(due_at)
        if forward_key is not None:
            headers[X_FORWARD_ROUTING_KEY] = forward_key
        try:
            with scope.publishing(
                headers, kind="retry", exchange=exchange, routing_key=routing_key
            ):
                await self.forward(
                    message, exchange=exchange, routing_key=routing_key, headers=headers
                )
        except PublishError as err:
            if not _unencodable(err):
                raise
            # No retry can ever carry these headers; parking keeps the record.
            log.error(
                "message %s on queue %r cannot be re-published for a retry (%s); parking it",
                message.message_id,
                self.queue,
                err,
            )
            return Decision.park("unencodable")
        log.info(
            "message %s on queue %r failed (attempt %d, %s); retrying in %.3f s",
            message.message_id,
            self.queue,
            state.attempt,
            type(exc).__name__,
            decision.delay,
        )
        return decision

    async def _retry_target(self, message: AbstractIncomingMessage) -> tuple[str, str | None]:
        """(chain destination, forward routing key or None) of a retry of ``message``.

        With ``return_to="exchange"`` a retry goes to the exchange and key of
        the delivery itself (broker-set, not read from headers), through its
        forward queue. Deliveries straight to the queue (default exchange) or
        out of the chain have no such exchange and return to the queue.
        """
        exchange = message.exchange
        if (
            self.return_to != "exchange"
            or not exchange
            or self.topology.is_chain_exchange(exchange)
        ):
            return self.queue, None
        connection = message.channel.connection
        await declare_forward_queue(connection, self.topology, exchange)
        return forward_queue_name(self.topology, exchange), message.routing_key or ""

    async def _park(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: BaseException,
        reason: str,
        scope: AttemptScope,
        now: datetime,
    ) -> None:
        # Re-declared so that one deleted by hand comes back; one declaration (one channel)
        # at a time per connection serves a whole storm of parks (declare.py).
        connection = message.channel.connection
        await declarer_for(connection).parking(
            connection, self.topology, self.queue, self.parking_queue
        )
        headers = parking_headers(message.headers, state, exc, now=now, reason=reason)
        exchange = self.topology.parking_exchange
        try:
            with scope.publishing(headers, kind="park", exchange=exchange, routing_key=self.queue):
                await self.forward(
                    message, exchange=exchange, routing_key=self.queue, headers=headers
                )
        except PublishError as err:
            if not _unencodable(err):
                raise
            # The original headers cannot be encoded: park with the record alone.
            record = parking_headers({}, state, exc, now=now, reason=reason)
            record["x-parked-note"] = f"original headers dropped: {err}"
            await self.forward(message, exchange=exchange, routing_key=self.queue, headers=record)
        log.warning(
            "message %s on queue %r parked (%s) after %d attempt(s): %s",
            message.message_id,
            self.queue,
            reason,
            state.attempt,
            exc,
        )


def _unencodable(err: PublishError) -> bool:
    """Whether a publish failed because the message cannot be encoded (not the broker)."""
    return isinstance(err.__cause__, TypeError | ValueError | OverflowError | struct.error)


def channel_open(message: AbstractIncomingMessage) -> bool:
    try:
        channel = message.channel  # aio-pika raises once the channel is closed
    except Exception:
        return False
    return not getattr(channel, "is_closed", True)


async def ack(message: AbstractIncomingMessage, queue: str) -> None:
    """Ack a handled or handed-over message; a failure only means a duplicate later."""
    try:
        await message.ack()
    except Exception as err:  # done or handed over; the original will be redelivered
        log.warning(
            "message %s on queue %r was handled or handed over but could not be acked (%r); "
            "it will be delivered again (a duplicate, not a loss)",
            message.message_id,
            queue,
            err,
        )


async def give_back(message: AbstractIncomingMessage, queue: str, err: BaseException) -> None:
    """Return a message that could not be handed over to its queue."""
    log.error(
        "could not hand over message %s from queue %r (%s); returning it to the queue",
        message.message_id,
        queue,
        err,
    )
    try:
        await message.nack(requeue=True)
    except Exception as nack_err:  # channel gone: the broker redelivers it anyway
        log.warning(
            "could not nack message %s (%r); the broker will redeliver it",
            message.message_id,
            nack_err,
        )
