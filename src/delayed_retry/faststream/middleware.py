"""``DelayedRetry``: the delayed retries of ``@with_delayed_retry`` as a FastStream middleware.

Each message of a subscriber goes through the decorator's own
:class:`~delayed_retry.consumer.handler.RetryingHandler`, made once per subscriber;
only the acks are FastStream's (what settles a message when: ``docs/faststream.md``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Unpack

from faststream import BaseMiddleware
from faststream.exceptions import (
    AckMessage,
    HandlerException,
    NackMessage,
    RejectMessage,
    SkipMessage,
    StopConsume,
)

from delayed_retry.amqp.chain import ToQueue, send_into_chain
from delayed_retry.amqp.channels import close_quietly
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.delivery_log import DELIVERY_LOG
from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.consumer.handover import requeue
from delayed_retry.consumer.options import SubscriberOptions
from delayed_retry.consumer.outbox import CURRENT_OUTBOX, Outbox
from delayed_retry.consumer.settings import RetryOptions, retry_options
from delayed_retry.consumer.settlement import GuardedMessage
from delayed_retry.consumer.startup import ConsumerStart, check_start
from delayed_retry.consumer.throttle import ThrottleControl
from delayed_retry.durations import format_duration, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.faststream.in_memory import InMemoryDecision, is_in_memory, run_in_memory
from delayed_retry.faststream.subscribers import (
    check_ack_policy,
    middlewares_of,
    queue_name_of,
    warn_about_telemetry_order,
    warn_about_unrestorable_queue,
)
from delayed_retry.headers.names import X_RETRY
from delayed_retry.headers.values import header_int
from delayed_retry.recovery.policy import Decision

if TYPE_CHECKING:
    from faststream import ContextRepo, StreamMessage
    from faststream._internal.basic_types import AsyncFuncAny

__all__ = ["DelayedRetry"]

log = logging.getLogger(__name__)

FASTSTREAM_CONFIRMS = "leave FastStream's Channel(publisher_confirms=True), its default"
"""How to get a channel that confirms publishes, in FastStream."""

IN_MEMORY_DECISIONS = 1000
"""How many decisions :attr:`DelayedRetry.decisions` keeps under the in-memory test client."""


class HandedOver(SkipMessage):
    """FastStream's signal that a failed message was retried or parked by the library.

    A :class:`~faststream.exceptions.SkipMessage`: FastStream neither settles the
    message again nor publishes a result for it. FastStream logs its text, so
    the text says what happened to the message (:func:`handed_over_text`).
    """

    def __init__(self, text: str = "") -> None:
        super().__init__()
        self.text = text or "not handled here: delayed-retry settled it"

    def __str__(self) -> str:
        return self.text


def handed_over_text(
    error: BaseException | None,
    *,
    decision: Decision | InMemoryDecision | None,
    queue: str,
    parking_queue: str | None,
) -> str:
    """What became of a message the handler did not finish, for FastStream's log line.

    ``decision`` is what was carried out (``None``: nothing could be, the
    message was given back); ``parking_queue`` is ``None`` where there is none
    (the in-memory test broker).
    """
    if error is None:
        return (
            "not handled yet: it came out of the delay chain before its due time and waits "
            f"again, or was given back to {queue!r}"
        )
    failure = f"failed ({type(error).__name__}: {error}); "
    if decision is None:
        return f"{failure}could not be retried or parked now: given back to {queue!r}"
    if decision.action == "retry":
        return (
            f"{failure}retried: back in {queue!r} in {format_duration(decision.delay)} "
            "through the delay chain"
        )
    where = "" if parking_queue is None else f" in {parking_queue!r}"
    return f"{failure}parked{where} ({decision.reason})"


@dataclass(frozen=True)
class _Served:
    """What one :class:`DelayedRetry` does for one subscriber, decided at its first message."""

    subscriber: Any
    queue: str
    handler: RetryingHandler[Any] | None
    """``None``: another ``DelayedRetry`` nearer the handler (a router's) serves it."""


class _Attempt:
    """One run of the handler through FastStream's remaining middlewares."""

    __slots__ = ("called", "error", "failed", "guarded", "outbox", "result", "signal")

    def __init__(self) -> None:
        self.called = False
        self.failed = False
        self.error: BaseException | None = None
        self.guarded: GuardedMessage | None = None
        self.result: Any = None
        self.signal: HandlerException | None = None
        self.outbox: Outbox | None = None
        """With ``outbox=True``: what the last run held, and whether it was released."""


async def _run_handler(
    call_next: AsyncFuncAny, msg: StreamMessage[Any], attempt: _Attempt, guarded: GuardedMessage
) -> None:
    """The function a subscriber's ``RetryingHandler`` wraps: FastStream's handler call.

    Called again for each immediate retry: only the last run's outcome counts.
    """
    attempt.called = True
    attempt.failed = False
    attempt.signal = None
    attempt.guarded = guarded
    attempt.outbox = CURRENT_OUTBOX.get()
    raw = msg.raw_message
    # The handler's msg.nack()/reject() reach the guarded message: deferred until it
    # returns, dropped if it raises (the failure is retried), as in the decorator.
    msg.raw_message = guarded
    try:
        attempt.result = await call_next(msg)
    except (AckMessage, NackMessage, RejectMessage) as signal:
        attempt.signal = signal
        settle = {AckMessage: msg.ack, NackMessage: msg.nack, RejectMessage: msg.reject}
        await settle[type(signal)](**signal.extra_options)
    except SkipMessage as signal:
        attempt.signal = signal  # left unsettled, as FastStream does
    except BaseException as exc:
        attempt.failed = True
        attempt.error = exc
        raise
    finally:
        msg.raw_message = raw


class DelayedRetry:
    """Delayed retries and parking for a FastStream RabbitMQ app, as a broker middleware.

    Use it where a FastStream subscriber's handler may fail for reasons that
    pass: ``RabbitBroker(url, middlewares=[DelayedRetry(...)])`` for every
    subscriber, or ``RabbitRouter(middlewares=[DelayedRetry(...)])`` for one
    router's (it overrides the broker's). Its options are the decorator's but
    ``queue``: :class:`~delayed_retry.consumer.options.SubscriberOptions`. Under
    ``TestRabbitBroker`` the policy's decisions are recorded in :attr:`decisions`.
    """

    def __init__(self, **options: Unpack[SubscriberOptions]) -> None:
        if "queue" in options:
            raise TypeError(
                "DelayedRetry() got an unexpected keyword argument 'queue': it retries each "
                "subscriber's failures to that subscriber's own queue; drop queue="
            )
        self.options: RetryOptions = retry_options(
            options, accepted=SubscriberOptions, caller="DelayedRetry()"
        )
        self._served: dict[int, _Served] = {}
        self.refused: set[int] = set()
        """Subscribers (by id) already reported as refused."""
        self.decisions: deque[InMemoryDecision] = deque(maxlen=IN_MEMORY_DECISIONS)
        """Under ``TestRabbitBroker`` only: the policy's decision on each failure, newest last."""

    def __repr__(self) -> str:
        retries, prefix = self.options.policy.max_retries, self.options.topology.prefix
        return f"<DelayedRetry max_retries={retries} prefix={prefix!r}>"

    async def release_held(self) -> int:
        """Give back what every subscriber holds, before ``broker.stop()`` on a graceful stop.

        Messages held until due go back to their queue now; with a crash guard
        they, and every message that reaches a handler afterwards, go back as
        new messages, so the stop counts as no crash; throttles stop probing.
        Returns how many held messages were released.
        """
        for served in list(self._served.values()):
            if served.handler is not None and served.handler.throttle is not None:
                await served.handler.throttle.stop()
        return self.options.held.release()

    def throttle_of(self, queue: str) -> ThrottleControl | None:
        """The throttle of the subscriber of ``queue`` this middleware serves, once it has had a
        message (``None`` before, or without ``throttle=``): its state, for health checks."""
        for served in self._served.values():
            if served.queue == queue and served.handler is not None:
                return served.handler.throttle
        return None

    def __call__(self, msg: Any | None, /, *, context: ContextRepo) -> _RetryMiddleware:
        return _RetryMiddleware(msg, context=context, retrier=self)

    def served(self, subscriber: Any, raw: Any) -> _Served:
        """What this middleware does for ``subscriber``; checked and built at its first message."""
        served = self._served.get(id(subscriber))
        if served is not None and served.subscriber is subscriber:
            return served
        queue = queue_name_of(subscriber)
        stack = middlewares_of(subscriber)
        retriers = [m for m in stack if isinstance(m, DelayedRetry)]
        handler: RetryingHandler[Any] | None = None
        if not retriers or retriers[-1] is self:
            check_ack_policy(subscriber, queue)
            target = check_start(self._start(subscriber, raw, queue))
            warn_about_telemetry_order(stack, self, queue)
            if not is_in_memory(raw):
                warn_about_unrestorable_queue(subscriber, queue)
            handler = RetryingHandler(
                _run_handler,
                replace(self.options, queue=queue, ack_on_success=False, dead_letter_queue=target),
            )
        served = self._served[id(subscriber)] = _Served(subscriber, queue, handler)
        return served

    def _start(self, subscriber: Any, raw: Any, queue: str) -> ConsumerStart:
        """What the start-up check sees of ``subscriber`` and the channel of its message."""
        start = ConsumerStart(
            consumer="DelayedRetry",
            queue=queue,
            topology=self.options.topology,
            returns_to=(queue,),
            confirms=None,
        )
        if is_in_memory(raw):  # the in-memory test broker: no channel, no broker
            return start
        return replace(
            start,
            confirms=bool(getattr(raw.channel, "publisher_confirms", True)),
            confirms_fix=FASTSTREAM_CONFIRMS,
            arguments=getattr(subscriber.queue, "arguments", None),
            max_retries=self.options.policy.max_retries,
            server_properties=getattr(raw.channel.connection, "server_properties", None),
        )


class _RetryMiddleware(BaseMiddleware):
    """One message's pass through a :class:`DelayedRetry`."""

    def __init__(self, msg: Any | None, /, *, context: ContextRepo, retrier: DelayedRetry) -> None:
        super().__init__(msg, context=context)
        self.retrier = retrier

    async def consume_scope(self, call_next: AsyncFuncAny, msg: StreamMessage[Any]) -> Any:
        raw = msg.raw_message
        subscriber = self.context.get_local("handler_")
        if subscriber is None:  # not a subscriber's message (e.g. a pulled one): not ours
            return await call_next(msg)
        try:
            served = self.retrier.served(subscriber, raw)
        except ConfigurationError as exc:
            queue = queue_name_of(subscriber)
            if getattr(raw, "processed", True):
                # Consumed with no_ack (ACK_FIRST): the broker already forgot this message
                # and pushes the rest of the queue regardless of prefetch. Stopping would
                # drop those; each goes back through the chain instead, unhandled.
                first = id(subscriber) not in self.retrier.refused
                self.retrier.refused.add(id(subscriber))
                await _send_back_through_chain(
                    raw, exc, queue=queue, topology=self.retrier.options.topology, log_it=first
                )
                raise HandedOver from exc
            log.error("%s; this subscriber stops consuming", exc)
            await requeue(raw)
            raise StopConsume from exc
        if served.handler is None:
            return await call_next(msg)
        if is_in_memory(raw):
            return await self._in_memory(call_next, msg, served.queue)
        attempt = _Attempt()
        token = DELIVERY_LOG.set(self._delivery_log(raw))
        try:
            await served.handler(call_next, msg, attempt, raw)
        finally:
            DELIVERY_LOG.reset(token)
        if attempt.signal is not None:
            raise attempt.signal
        if attempt.failed or not attempt.called:
            # Retried, parked, held and sent back, or given back: settled by the library.
            options = self.retrier.options
            raise HandedOver(
                handed_over_text(
                    attempt.error,
                    decision=None if attempt.guarded is None else attempt.guarded.handed_over,
                    queue=served.queue,
                    parking_queue=options.parking_queue
                    or options.topology.default_parking_queue(served.queue),
                )
            )
        if attempt.outbox is not None and attempt.outbox.held and not attempt.outbox.released:
            raise HandedOver(
                f"handled, but the {len(attempt.outbox.held)} message(s) it published through "
                "its outbox were not confirmed: given back to "
                f"{served.queue!r} (the outbox's publishes are tried again with it)"
            )
        return attempt.result

    def _delivery_log(self, raw: Any) -> Callable[[int, str], None] | None:
        """The library's lines about this delivery, written through FastStream's logger.

        With FastStream's context (``| queue | id -``), like its own "Received" and
        "Processed"; a retry's delivery says first which attempt it is, so its "Received"
        is not taken for a second one of the message it retries.
        """
        logger = self.context.get_local("logger")
        if not isinstance(logger, logging.Logger):
            return None
        extra = self.context.get_local("log_context", {})

        def write(level: int, text: str) -> None:
            logger.log(level, text, extra=extra)

        retries = header_int((raw.headers or {}).get(X_RETRY))
        if retries:
            write(logging.INFO, f"attempt {retries + 1}: retry {retries} of this message")
        return write

    async def _in_memory(self, call_next: AsyncFuncAny, msg: StreamMessage[Any], queue: str) -> Any:
        options = self.retrier.options
        result, decision = await run_in_memory(
            call_next, msg, queue, options.policy, options.immediate
        )
        if decision is None:
            return result
        self.retrier.decisions.append(decision)
        # No chain here: say what the policy decided, as FastStream's log line would.
        text = handed_over_text(decision.error, decision=decision, queue=queue, parking_queue=None)
        raise HandedOver(f"{text} (in-memory test broker: no chain; recorded in decisions)")


REFUSED_REDELIVERY = timedelta(seconds=2)
"""How long a message that a refused ``no_ack`` subscriber took waits in the chain before it is
back in its queue."""


async def _send_back_through_chain(
    raw: Any, exc: ConfigurationError, *, queue: str, topology: DelayTopology, log_it: bool
) -> None:
    """Put a message a refused ``no_ack`` subscriber took back into ``queue``, unhandled.

    The broker forgot it on delivery (``ACK_FIRST``), so it goes back through
    the delay chain on a channel with publisher confirms, due in
    :data:`REFUSED_REDELIVERY`; the subscriber takes it again and puts it back
    again until the application is fixed (``check_subscribers`` at start-up
    refuses it before anything is consumed). Should that publish fail, the
    error names the message.
    """
    if log_it:
        log.error(
            "%s; until then its messages are put back into %r through the delay chain, "
            "unhandled, every %s",
            exc,
            queue,
            REFUSED_REDELIVERY,
        )
    try:
        channel = await raw.channel.connection.channel(publisher_confirms=True)
        try:
            await send_into_chain(
                channel,
                raw,
                topology=topology,
                to=ToQueue(queue, with_parking=False),
                due_at=utcnow() + REFUSED_REDELIVERY,
                headers=dict(raw.headers or {}),
            )
        finally:
            await close_quietly(channel)
    except Exception as err:
        log.error(
            "message %s from queue %r was consumed with no_ack (ACK_FIRST) and could not be "
            "put back (%r): it is lost unless its producer sends it again",
            raw.message_id,
            queue,
            err,
        )
