"""What happens to a message whose handler failed: a retry through the chain, or parking.

:class:`FailureHandling` carries out the retry policy's
:class:`~delayed_retry.recovery.policy.Decision` for one queue: it builds the retry
copy (or the parking record) and moves it through the one hand-over
(:func:`~delayed_retry.consumer.handover.hand_over`), so the original is acked
only once its copy is confirmed. The decorator and the router use it.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, cast

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.amqp.chain import ToExchange, ToQueue, send_into_chain
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.amqp.publish import Publisher, publish_confirmed, publish_copy
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.delivery_log import log_delivery
from delayed_retry.consumer.handover import (
    DEFAULT_TIMING,
    HandOverTiming,
    RequeueBackoff,
    ack,
    hand_over,
    requeue_after_backoff,
)
from delayed_retry.consumer.hooks import FailureEvent, FailureHooks
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import DelayOutOfRangeError, PublishError
from delayed_retry.headers.names import X_DUE_AT, X_PARKED_NOTE
from delayed_retry.headers.parking_record import parking_headers
from delayed_retry.headers.retry_state import RetryState, failure_headers
from delayed_retry.headers.values import sanitize_headers
from delayed_retry.observability.instrumentation import AttemptScope, NoInstrumentation
from delayed_retry.recovery.hold import Hold
from delayed_retry.recovery.policy import Decision, ParkReason

__all__ = ["FailureHandling"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class FailureHandling:
    """Where and how the failed messages of one queue go: back through the chain, or parked."""

    queue: str
    topology: DelayTopology
    parking_queue: str | None
    publish_timeout: float
    requeue_backoff: RequeueBackoff = field(default_factory=RequeueBackoff)
    """Messages requeued in a row, unhandled: the pause before the next requeue."""
    return_to: Literal["queue", "exchange"]
    hold: Hold | None = None
    """Retries to the queue leave the chain early by this hold's lead; the handler holds them."""
    consumed_from_queue: bool = True
    """Whether the failed messages come from ``queue`` itself (a consumer, not the router).

    Only then does a retry due at once go straight back to ``queue``: its unacked
    original proves the queue exists, and a deleted queue took its messages with it.
    A message handed over from elsewhere keeps the chain route, whose alternate
    exchange keeps it in the unroutable queue if ``queue`` was deleted.
    """
    record_runs: bool = False
    """Whether immediate retries are on: each copy then records the delivery's handler runs."""
    hooks: FailureHooks | None = None
    """Told of each retry and parking once its hand-over is done."""
    timing: HandOverTiming = DEFAULT_TIMING
    """How long an unconfirmed hand-over is tried, and the pauses before a message goes back."""
    publish: Publisher = publish_confirmed
    """What publishes the copies, with confirms: passed in, so whoever builds the handling
    chooses it (one that fails or records shows what a hand-over does when the broker does)."""

    before_retry: Callable[[AbstractIncomingMessage, datetime], Awaitable[None]] | None = None
    """Awaited before a retry copy leaves, with its due time: an ordered key records that it
    waits for the message (:mod:`delayed_retry.consumer.ordering`) before the message goes."""

    async def redelay(self, message: AbstractIncomingMessage, due_at: datetime) -> None:
        """Send a message that arrived before its due time back for the rest of its wait."""

        async def publish() -> bool:
            await send_into_chain(
                message.channel,
                message,
                topology=self.topology,
                to=ToQueue(self.queue, declare=False),
                due_at=due_at,
                hold=self.hold,
                early=True,
                headers=sanitize_headers(message.headers),
                timeout=self.publish_timeout,
                publish=self.publish,
            )
            return True

        await hand_over(message, publish, queue=self.queue, timing=self.timing)

    async def park_now(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: BaseException,
        reason: str,
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Park ``message`` for ``reason`` (one attempt, raising if not confirmed), then ack it.

        ``extra`` headers are added to the parking record."""
        with NoInstrumentation().attempt(message, state, queue=self.queue) as scope:
            await self._park(message, state, exc, reason, scope, utcnow(), extra=extra)
        await ack(message, self.queue)
        if self.hooks is not None:
            decision = Decision("park", reason=cast(ParkReason, reason))
            await self._notify(message, state, exc, decision)

    async def requeue_after_backoff(
        self, message: AbstractIncomingMessage, err: BaseException
    ) -> None:
        """Keep ``message`` for a backoff pause, then requeue it (``nack``, requeue)."""
        await requeue_after_backoff(
            message, self.queue, err, self.requeue_backoff, timing=self.timing
        )

    async def failed(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: Exception,
        decision: Decision,
        scope: AttemptScope,
    ) -> Decision | None:
        """Carry out ``decision`` for a message whose handler raised ``exc``, then ack it.

        Returns the decision carried out (a retry can turn into a parking), or
        ``None`` when the hand-over failed and the message was requeued.
        """
        carried_out = await hand_over(
            message,
            functools.partial(self._send, message, state, exc, decision, scope),
            queue=self.queue,
            timing=self.timing,
        )
        if carried_out is None:
            scope.finish("error", exc=exc)
            return None
        if carried_out.action == "retry":
            scope.finish("retry", delay=carried_out.delay, exc=exc)
        else:
            scope.finish("parked", exc=exc, reason=carried_out.reason)
        if self.hooks is not None:
            await self._notify(message, state, exc, carried_out)
        return carried_out

    async def _notify(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: BaseException,
        decision: Decision,
    ) -> None:
        assert self.hooks is not None
        event = FailureEvent(
            message=message, queue=self.queue, state=state, exception=exc, decision=decision
        )
        await self.hooks.notify(event)

    async def _send(
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
            if decision.action == "retry":
                return decision
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
        """Send the retry copy into the chain; a decision to park when no copy can go."""
        try:
            due_at = now + timedelta(seconds=decision.delay)
        except OverflowError:
            return Decision.park("delay-out-of-range")
        if self.before_retry is not None:
            await self.before_retry(message, due_at)
        try:
            await send_into_chain(
                message.channel,
                message,
                topology=self.topology,
                to=self._retry_destination(message),
                due_at=due_at,
                now=now,
                hold=self.hold,  # handlers and forwarders hold what leaves the chain early
                headers=self._retry_headers(message, state, exc, now, due_at),
                straight_when_due=self.consumed_from_queue,
                observe=functools.partial(scope.publishing, kind="retry"),
                timeout=self.publish_timeout,
                publish=self.publish,
            )
        except (DelayOutOfRangeError, OverflowError):
            return Decision.park("delay-out-of-range")
        except PublishError as err:
            if not _unencodable(err):
                raise
            # No retry can ever carry these headers; parking keeps the record.
            log_delivery(
                log,
                logging.ERROR,
                "message %s on queue %r cannot be re-published for a retry (%s); parking it",
                message.message_id,
                self.queue,
                err,
            )
            return Decision.park("unencodable")
        log_delivery(
            log,
            logging.INFO,
            "message %s on queue %r failed (attempt %d, %s); retrying in %.3f s",
            message.message_id,
            self.queue,
            state.attempt,
            type(exc).__name__,
            decision.delay,
        )
        return decision

    def _retry_headers(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: Exception,
        now: datetime,
        due_at: datetime,
    ) -> dict[str, Any]:
        """The retry copy's headers: its retry state one higher, and its due time."""
        headers = failure_headers(
            message.headers, state, exc, now=now, retries=state.retries + 1, runs=self._runs(state)
        )
        headers[X_DUE_AT] = to_epoch_ms(due_at)
        return headers

    def _runs(self, state: RetryState) -> int | None:
        """Handler runs in this delivery, for the copy's record; ``None``: not recorded."""
        return state.immediate_retries + 1 if self.record_runs else None

    def _retry_destination(self, message: AbstractIncomingMessage) -> ToQueue | ToExchange:
        """Where a retry of ``message`` goes: back to ``queue``, or to its delivery's exchange.

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
            return ToQueue(self.queue, self.parking_queue)
        return ToExchange(exchange, message.routing_key or "")

    async def _park(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        exc: BaseException,
        reason: str,
        scope: AttemptScope,
        now: datetime,
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        # Re-declared so that one deleted by hand comes back; one declaration (one channel)
        # at a time per connection serves a whole storm of parks (amqp/declarer.py).
        connection = message.channel.connection
        await declarer_for(connection).parking(
            connection, self.topology, self.queue, self.parking_queue
        )
        headers = parking_headers(
            message.headers, state, exc, now=now, reason=reason, runs=self._runs(state)
        )
        if extra:
            headers.update(extra)
        exchange = self.topology.parking_exchange
        publish = functools.partial(
            publish_copy,
            message.channel,
            message,
            exchange=exchange,
            routing_key=self.queue,
            timeout=self.publish_timeout,
            publish=self.publish,
        )
        try:
            with scope.publishing(headers, kind="park", exchange=exchange, routing_key=self.queue):
                await publish(headers=headers)
        except PublishError as err:
            if not _unencodable(err):
                raise
            # The original headers cannot be encoded: park with the record alone.
            record = parking_headers({}, state, exc, now=now, reason=reason, runs=self._runs(state))
            record[X_PARKED_NOTE] = f"original headers dropped: {err}"
            await publish(headers=record)
        log_delivery(
            log,
            logging.WARNING,
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
