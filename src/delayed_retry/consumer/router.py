"""Delayed retries for consumers in any language: the router of rejected messages.

:class:`RetryRouter` consumes ``<prefix>.rejected``, where the broker dead-letters
what consumers reject, and retries or parks each message as the decorator does,
only to the queues it was started with; anything else is kept in
``<prefix>.unroutable``. How it reads ``x-death`` and what it keeps: ``docs/any-language.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Unpack

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from delayed_retry.amqp.chain import keep_unroutable
from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.amqp.consumers import Consumer, consume_queue
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.failures import FailureHandling
from delayed_retry.consumer.handover import RequeueBackoff, hand_over, requeue_after_backoff
from delayed_retry.consumer.in_flight import InFlight
from delayed_retry.consumer.options import RouterOptions
from delayed_retry.consumer.rejections import RETRIED_REASONS, Rejection, read_rejection
from delayed_retry.consumer.settings import router_settings
from delayed_retry.consumer.startup import ConsumerStart, check_start
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import DelayedRetryError
from delayed_retry.headers.names import X_CLAIMED_QUEUE, X_PARKED_AT, X_PARKED_REASON
from delayed_retry.headers.values import sanitize_headers
from delayed_retry.observability.instrumentation import Instrumentation
from delayed_retry.recovery.policy import Decision, RetryPolicy

__all__ = ["ConsumerRejected", "RetryRouter"]

log = logging.getLogger(__name__)


class ConsumerRejected(DelayedRetryError):
    """The failure the router records for a message a consumer rejected.

    It stands where the decorator records the handler's exception: its type
    and message go into ``x-retry-last-error`` and the parking record.
    """

    def __init__(self, queue: str, reason: str) -> None:
        self.queue = queue
        self.reason = reason
        verb = (
            "rejected by a consumer of" if reason == "rejected" else f"dead-lettered ({reason}) by"
        )
        super().__init__(f"message {verb} queue {queue!r}")


class RetryRouter:
    """Retries, then parks, what consumers of ``queues`` reject, whatever their language.

    Use it when a queue's consumers are not Python (or not wrapped with
    :func:`~delayed_retry.with_delayed_retry`) but should get the same delayed
    retries: set ``x-dead-letter-exchange`` to ``topology.rejected_exchange`` on
    the queue and list it in ``queues`` of every router of the prefix. Its other
    options are keyword-only: :class:`~delayed_retry.consumer.options.RouterOptions`.
    """

    def __init__(self, *, queues: Iterable[str], **options: Unpack[RouterOptions]) -> None:
        settings = router_settings(queues, options, caller="RetryRouter()")
        self.queues: tuple[str, ...] = settings.queues
        self.topology: DelayTopology = settings.topology
        self.policy: RetryPolicy = settings.policy
        self.publish_timeout: float = settings.publish_timeout
        self.prefetch: int = settings.prefetch
        self.instrumentation: Instrumentation = settings.instrumentation
        self._known = frozenset(settings.queues)
        self._requeue_backoff = RequeueBackoff()
        self.in_flight = InFlight()
        """Rejected messages being handed over now (a stopping service waits for them)."""
        self.consumer: Consumer | None = None
        """Its consumer of ``<prefix>.rejected`` once started (``consumer.in_place`` for probes)."""

    def __repr__(self) -> str:
        return f"<RetryRouter prefix={self.topology.prefix!r} queues={list(self.queues)!r}>"

    async def declare(self, channel: AbstractChannel | Any) -> None:
        """Declare the chain (with ``<prefix>.rejected``), each queue's binding and parking."""
        underlay = await underlay_channel(channel)
        declarer = declarer_for(underlay.connection)
        await declarer.topology(underlay.connection, self.topology)
        for queue in self.queues:
            await declarer.destination(underlay.connection, self.topology, queue)

    async def start(self, channel: AbstractChannel) -> str:
        """Declare what is needed and consume ``<prefix>.rejected``; returns the consumer tag.

        ``channel`` must have publisher confirms (aio-pika's default): a
        rejected message is acked only after its next home confirmed it.
        """
        underlay = await underlay_channel(channel)
        check_start(
            ConsumerStart(
                consumer=repr(self),
                queue=self.topology.rejected_queue,
                topology=self.topology,
                returns_to=self.queues,
                confirms=bool(getattr(underlay, "publisher_confirms", False)),
            )
        )
        await self.declare(channel)
        await channel.set_qos(prefetch_count=self.prefetch)
        self.consumer = await consume_queue(channel, self.topology.rejected_queue, self.handle)
        log.info(
            "routing rejections of %s from %r",
            ", ".join(map(repr, self.queues)),
            self.topology.rejected_queue,
        )
        return self.consumer.tag

    @property
    def consuming(self) -> bool:
        """Whether the broker has its consumer of ``<prefix>.rejected`` now."""
        return self.consumer is not None and self.consumer.in_place

    async def stop_consuming(self) -> None:
        """Cancel its consumer: no new rejected messages arrive; those in flight go on."""
        if self.consumer is not None:
            await self.consumer.cancel()

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Retry, park or keep one message from ``<prefix>.rejected``; ack only once handed over.

        A failure of the router itself (a refused declaration, a wait strategy
        that raised) gives the message back after a growing pause: never lost,
        never spinning.
        """
        try:
            with self.in_flight.track():
                await self._handle(message)
        except Exception as exc:
            log.exception("router failed on message %s", message.message_id)
            await requeue_after_backoff(
                message, self.topology.rejected_queue, exc, self._requeue_backoff
            )
        else:
            self._requeue_backoff.reset()

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        rejection = read_rejection(message.headers, queues=self._known)
        if rejection.queue is None or rejection.state is None:
            await self._keep(message, rejection)
            return
        queue, state = rejection.queue, rejection.state
        reason = rejection.reason or "rejected"
        for problem in state.problems:
            log.warning("message %s rejected from %r: %s", message.message_id, queue, problem)
        exc = ConsumerRejected(queue, reason)
        if reason in RETRIED_REASONS:
            decision = self.policy.decide(state, exc, now=utcnow())
        else:
            decision = Decision.park("not-retryable")
        failures = FailureHandling(
            queue=queue,
            topology=self.topology,
            parking_queue=None,
            publish_timeout=self.publish_timeout,
            return_to="queue",  # the queue x-death names: the router knows no exchange to trust
            consumed_from_queue=False,  # from <prefix>.rejected: keep the chain's safety net
        )
        with self.instrumentation.attempt(message, state, queue=queue) as scope:
            await failures.failed(message, state, exc, decision, scope)

    async def _keep(self, message: AbstractIncomingMessage, rejection: Rejection) -> None:
        """Keep a message the router must not route in ``<prefix>.unroutable``, with a record."""
        assert rejection.problem is not None
        headers = sanitize_headers(message.headers)
        headers[X_PARKED_REASON] = rejection.problem
        headers[X_PARKED_AT] = to_epoch_ms(utcnow())
        if rejection.claimed_queue is not None:
            headers[X_CLAIMED_QUEUE] = rejection.claimed_queue

        async def publish() -> bool:
            await keep_unroutable(
                message.channel,
                message,
                topology=self.topology,
                routing_key=message.routing_key or "",
                headers=headers,
                timeout=self.publish_timeout,
            )
            return True

        if await hand_over(message, publish, queue=self.topology.rejected_queue) is None:
            return
        if rejection.problem == "unknown-queue":
            log.warning(
                "message %s was rejected from queue %r, which this router was not started with "
                "(%s); kept in %r. Add --queue %s to the router, then replay it from there",
                message.message_id,
                rejection.claimed_queue,
                ", ".join(self.queues),
                self.topology.unroutable_queue,
                rejection.claimed_queue,
            )
        else:
            log.warning(
                "message %s in %r has no x-death record, so no consumer rejected it (published "
                "straight to %r?); kept in %r",
                message.message_id,
                self.topology.rejected_queue,
                self.topology.rejected_exchange,
                self.topology.unroutable_queue,
            )
