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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiormq
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import publishing
from delayed_retry.declare import declare_parking_queue
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import DelayOutOfRangeError, PublishError
from delayed_retry.headers import (
    X_DUE_AT,
    RetryState,
    failure_headers,
    parking_headers,
    sanitize_headers,
)
from delayed_retry.observability.instrumentation import AttemptScope
from delayed_retry.policy import Decision
from delayed_retry.topology import DelayTopology

__all__ = ["HANDOVER_RETRY_WINDOW", "HandOver", "ack", "give_back"]

log = logging.getLogger(__name__)

HANDOVER_RETRY_WINDOW = 30.0
"""Seconds a failed hand-over is tried again, original unacked, before it is requeued."""
HANDOVER_FIRST_PAUSE = 0.5
HANDOVER_MAX_PAUSE = 8.0


@dataclass(frozen=True, kw_only=True)
class HandOver:
    """Where and how the failed messages of one queue are handed over."""

    queue: str
    topology: DelayTopology
    parking_queue: str | None
    publish_timeout: float

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
        now = utcnow()
        route = self.topology.route(self.topology.units_until(due_at, now=now), self.queue)
        try:
            await self.forward(
                message,
                exchange=route.exchange,
                routing_key=route.routing_key,
                headers=sanitize_headers(message.headers),
            )
        except (PublishError, aiormq.exceptions.AMQPError, ConnectionError) as err:
            await give_back(message, self.queue, err)
            return
        await ack(message, self.queue)

    async def failed(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: Exception,
        decision: Decision,
        scope: AttemptScope,
    ) -> None:
        """Carry out ``decision`` for a message whose handler raised ``exc``, then ack it."""
        # Requeueing an unconfirmed hand-over at once would spin, and every requeue counts
        # toward a quorum queue's delivery limit: try again while the channel is open.
        started = time.monotonic()
        pause = HANDOVER_FIRST_PAUSE
        while True:
            try:
                decision = await self._publish_copy(message, state, exc, decision, scope)
                break
            except (PublishError, aiormq.exceptions.AMQPError, ConnectionError) as err:
                elapsed = time.monotonic() - started
                if not _channel_open(message) or elapsed + pause > HANDOVER_RETRY_WINDOW:
                    scope.finish("error", exc=err)
                    await give_back(message, self.queue, err)
                    return
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
        try:
            due_at = now + timedelta(seconds=decision.delay)
            route = self.topology.route(self.topology.units_until(due_at, now=now), self.queue)
        except (DelayOutOfRangeError, OverflowError):
            return Decision.park("delay-out-of-range")
        headers = failure_headers(message.headers, state, exc, now=now, retries=state.retries + 1)
        headers[X_DUE_AT] = to_epoch_ms(due_at)
        try:
            with scope.publishing(
                headers, kind="retry", exchange=route.exchange, routing_key=route.routing_key
            ):
                await self.forward(
                    message, exchange=route.exchange, routing_key=route.routing_key, headers=headers
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

    async def _park(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: Exception,
        reason: str,
        scope: AttemptScope,
        now: datetime,
    ) -> None:
        # Parking is rare: re-declare the parking queue each time so one deleted by
        # hand is back before the message is routed to it.
        await declare_parking_queue(
            message.channel.connection, self.topology, self.queue, self.parking_queue
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


def _channel_open(message: AbstractIncomingMessage) -> bool:
    try:
        channel = message.channel  # aio-pika raises once the channel is closed
    except Exception:
        return False
    return not getattr(channel, "is_closed", True)


async def ack(message: AbstractIncomingMessage, queue: str) -> None:
    """Ack a message whose copy is confirmed; a failure only means a duplicate later."""
    try:
        await message.ack()
    except Exception as err:  # the copy is confirmed; the original will be redelivered
        log.warning(
            "message %s on queue %r was handed over but could not be acked (%r); "
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
