"""``@with_delayed_retry``: retries for aio-pika consumers, through the delay chain.

Order of operations on a failure, which is what makes it at-least-once: the
copy is published (into the chain, or to parking) on the consumer's channel
with publisher confirms; only after the confirm is the original acked. If the
process dies in between, the original is redelivered and the copy also
arrives: a duplicate, never a loss. If the hand-over is not confirmed (a nack,
a timeout, a channel error), the original stays unacked while the publish is
tried again with backoff for up to :data:`HANDOVER_RETRY_WINDOW` seconds, and
only then is it returned to its queue (``nack`` with requeue); the consumer
goes on with other messages meanwhile. See ``docs/reliability.md``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, overload

import aiormq
import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from delayed_retry.checks import warn_about_delivery_limit
from delayed_retry.declare import declare_parking_queue, declarer_for, underlay_of
from delayed_retry.durations import Duration, to_epoch_ms, to_seconds, utcnow
from delayed_retry.errors import (
    ConfigurationError,
    DelayOutOfRangeError,
    PublishError,
)
from delayed_retry.headers import (
    X_DUE_AT,
    X_PARKED_REASON,
    RetryState,
    failure_headers,
    parking_headers,
    parse_retry_state,
    sanitize_headers,
)
from delayed_retry.observe import AttemptScope, Instrumentation, default_instrumentation
from delayed_retry.policy import DEFAULT_WAIT, Decision, RetryPolicy
from delayed_retry.publishing import DEFAULT_PUBLISH_TIMEOUT, copy_properties, publish_confirmed
from delayed_retry.topology import DEFAULT_TOPOLOGY, DelayTopology

__all__ = ["RetryingHandler", "consume", "current_retry_state", "retry_state", "with_delayed_retry"]

log = logging.getLogger(__name__)

P = ParamSpec("P")

_current_state: contextvars.ContextVar[RetryState | None] = contextvars.ContextVar(
    "delayed_retry_state", default=None
)

HANDOVER_RETRY_WINDOW = 30.0
"""Seconds a failed hand-over is tried again, original unacked, before it is requeued."""
HANDOVER_FIRST_PAUSE = 0.5
HANDOVER_MAX_PAUSE = 8.0

EARLY_TOLERANCE = timedelta(milliseconds=50)
"""A message arriving this much before its due time is sent back for the rest of the wait."""


def current_retry_state() -> RetryState | None:
    """The retry state of the message being handled by this task, inside a wrapped handler."""
    return _current_state.get()


def retry_state(message: AbstractIncomingMessage, *, queue: str | None = None) -> RetryState:
    """Read the retry state of any message (attempt, first failure, original exchange …)."""
    return parse_retry_state(
        message.headers, exchange=message.exchange, routing_key=message.routing_key, queue=queue
    )


@dataclass(frozen=True, kw_only=True)
class RetryOptions:
    """Everything a :class:`RetryingHandler` is configured with."""

    queue: str | None
    policy: RetryPolicy
    topology: DelayTopology
    parking_queue: str | None
    publish_timeout: float
    instrumentation: Instrumentation


class RetryingHandler(Generic[P]):
    """An aio-pika consumer callback that retries its handler through the delay chain.

    Made by :func:`with_delayed_retry`; pass it to ``queue.consume``. Its
    last positional argument must be the ``AbstractIncomingMessage``.
    """

    def __init__(self, fn: Callable[P, Awaitable[object]], options: RetryOptions) -> None:
        self.fn = fn
        self.options = options
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", self.fn)
        return f"<RetryingHandler {name!r} queue={self.options.queue!r}>"

    def for_queue(self, queue: str) -> RetryingHandler[P]:
        """The same handler, retrying to ``queue``: for one handler consuming several queues."""
        self.options.topology.check_destination(queue)
        return RetryingHandler(self.fn, replace(self.options, queue=queue))

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        bound = RetryingHandler(self.fn.__get__(obj, objtype), self.options)
        return bound

    async def declare(self, channel: aiormq.abc.AbstractChannel | Any) -> None:
        """Declare the topology, the queue binding and the parking queue now, not on first use."""
        queue = self._queue()
        underlay = await underlay_of(channel)
        await declarer_for(underlay.connection).destination(
            underlay.connection, self.options.topology, queue, self.options.parking_queue
        )

    def _queue(self) -> str:
        if self.options.queue is None:
            raise ConfigurationError(
                f"{self!r} does not know which queue it consumes from, so it cannot send retries "
                "back; pass queue='name' to @with_delayed_retry or consume with "
                "delayed_retry.consume(queue, handler)"
            )
        return self.options.queue

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        message = args[-1] if args else None
        if not isinstance(message, AbstractIncomingMessage):
            raise TypeError(
                f"{self!r} was called without an aio-pika message as its last positional argument"
            )
        queue = self._queue()
        opts = self.options
        channel = message.channel
        # First use on this connection: declare what we need. A failure here leaves the
        # message unacked (redelivered when the channel closes): nothing is lost.
        await declarer_for(channel.connection).destination(
            channel.connection, opts.topology, queue, opts.parking_queue
        )
        state = parse_retry_state(
            message.headers, exchange=message.exchange, routing_key=message.routing_key, queue=queue
        )
        for problem in state.problems:
            log.warning("message %s on queue %r: %s", message.message_id, queue, problem)
        settled_before = message.processed
        now = utcnow()
        if (
            state.due_at is not None
            and message.exchange == opts.topology.delivery_exchange
            and state.due_at - now > EARLY_TOLERANCE
            and state.due_at - now <= opts.topology.max_delay
        ):
            await self._redelay(message, state, queue, now)
            return
        with opts.instrumentation.attempt(message, state, queue=queue) as scope:
            token = _current_state.set(state)
            try:
                await self.fn(*args, **kwargs)
            except Exception as exc:
                if message.processed and not settled_before:
                    log.error(
                        "handler %r settled message %s itself and then raised %r; "
                        "delayed-retry leaves it as the handler left it",
                        self,
                        message.message_id,
                        exc,
                    )
                    scope.finish("error", exc=exc, reason="settled-by-handler")
                    return
                decision = opts.policy.decide(state, exc, now=utcnow())
                await self._hand_over(message, state, queue, exc, decision, scope)
                return
            finally:
                _current_state.reset(token)
            if not message.processed:
                await message.ack()
            scope.finish("success")

    async def _redelay(
        self, message: AbstractIncomingMessage, state: RetryState, queue: str, now: datetime
    ) -> None:
        """Send a message that arrived before its due time back for the rest of its wait."""
        assert state.due_at is not None
        topology = self.options.topology
        route = topology.route(topology.units_until(state.due_at, now=now), queue)
        headers = sanitize_headers(message.headers)
        try:
            await publish_confirmed(
                message.channel,
                exchange=route.exchange,
                routing_key=route.routing_key,
                body=message.body,
                properties=copy_properties(message.properties, headers),
                timeout=self.options.publish_timeout,
            )
        except PublishError as err:
            await _give_back(message, queue, err)
            return
        await _ack(message, queue)

    async def _hand_over(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        queue: str,
        exc: Exception,
        decision: Decision,
        scope: AttemptScope,
    ) -> None:
        # A hand-over the broker did not confirm (a nack, a timeout, a closed channel) is
        # tried again while the channel is open, with the original kept unacked: requeueing
        # it at once would spin, and every requeue counts toward a quorum queue's delivery
        # limit. Once the channel is gone the broker redelivers the original by itself.
        started = time.monotonic()
        pause = HANDOVER_FIRST_PAUSE
        while True:
            try:
                decision = await self._publish_copy(message, state, queue, exc, decision, scope)
            except (PublishError, aiormq.exceptions.AMQPError, ConnectionError) as err:
                elapsed = time.monotonic() - started
                if _channel_open(message) and elapsed + pause <= HANDOVER_RETRY_WINDOW:
                    log.warning(
                        "hand-over of message %s from queue %r was not confirmed (%s); "
                        "keeping it unacked and trying again in %.1f s",
                        message.message_id,
                        queue,
                        err,
                        pause,
                    )
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, HANDOVER_MAX_PAUSE)
                    continue
                scope.finish("error", exc=err)
                await _give_back(message, queue, err)
                return
            break
        await _ack(message, queue)
        if decision.action == "retry":
            scope.finish("retry", delay=decision.delay, exc=exc)
        else:
            scope.finish("parked", exc=exc, reason=decision.reason)

    async def _publish_copy(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        queue: str,
        exc: Exception,
        decision: Decision,
        scope: AttemptScope,
    ) -> Decision:
        """Publish the retry copy or the parking record; return the decision carried out."""
        opts = self.options
        now = utcnow()
        if decision.action == "retry":
            try:
                due_at = now + timedelta(seconds=decision.delay)
                route = opts.topology.route(opts.topology.units_until(due_at, now=now), queue)
            except (DelayOutOfRangeError, OverflowError):
                decision = Decision.park("delay-out-of-range")
            else:
                headers = failure_headers(
                    message.headers, state, exc, now=now, retries=state.retries + 1
                )
                headers[X_DUE_AT] = to_epoch_ms(due_at)
                try:
                    with scope.publishing(
                        headers,
                        kind="retry",
                        exchange=route.exchange,
                        routing_key=route.routing_key,
                    ):
                        await publish_confirmed(
                            message.channel,
                            exchange=route.exchange,
                            routing_key=route.routing_key,
                            body=message.body,
                            properties=copy_properties(message.properties, headers),
                            timeout=opts.publish_timeout,
                        )
                except PublishError as err:
                    if not _unencodable(err):
                        raise
                    # No retry can ever carry these headers; parking keeps the record.
                    log.error(
                        "message %s on queue %r cannot be re-published for a retry (%s); "
                        "parking it",
                        message.message_id,
                        queue,
                        err,
                    )
                    decision = Decision.park("unencodable")
                else:
                    log.info(
                        "message %s on queue %r failed (attempt %d, %s); retrying in %.3f s",
                        message.message_id,
                        queue,
                        state.attempt,
                        type(exc).__name__,
                        decision.delay,
                    )
        if decision.action == "park":
            assert decision.reason is not None
            await self._park(message, state, queue, exc, decision.reason, scope, now)
        return decision

    async def _park(
        self,
        message: AbstractIncomingMessage,
        state: RetryState,
        queue: str,
        exc: Exception,
        reason: str,
        scope: AttemptScope,
        now: datetime,
    ) -> None:
        opts = self.options
        # Parking is rare: re-declare the parking queue each time so one deleted by
        # hand is back before the message is routed to it.
        await declare_parking_queue(
            message.channel.connection, opts.topology, queue, opts.parking_queue
        )
        headers = parking_headers(message.headers, state, exc, now=now, reason=reason)
        exchange = opts.topology.parking_exchange
        try:
            with scope.publishing(headers, kind="park", exchange=exchange, routing_key=queue):
                await publish_confirmed(
                    message.channel,
                    exchange=exchange,
                    routing_key=queue,
                    body=message.body,
                    properties=copy_properties(message.properties, headers),
                    timeout=opts.publish_timeout,
                )
        except PublishError as err:
            if not _unencodable(err):
                raise
            # The original headers cannot be encoded: park with the record alone.
            record = parking_headers({}, state, exc, now=now, reason=reason)
            record["x-parked-note"] = f"original headers dropped: {err}"
            await publish_confirmed(
                message.channel,
                exchange=exchange,
                routing_key=queue,
                body=message.body,
                properties=copy_properties(message.properties, record),
                timeout=opts.publish_timeout,
            )
        log.warning(
            "message %s on queue %r parked (%s) after %d attempt(s): %s",
            message.message_id,
            queue,
            headers[X_PARKED_REASON],
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


async def _ack(message: AbstractIncomingMessage, queue: str) -> None:
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


async def _give_back(message: AbstractIncomingMessage, queue: str, err: BaseException) -> None:
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


@overload
def with_delayed_retry(fn: Callable[P, Awaitable[object]], /) -> RetryingHandler[P]: ...


@overload
def with_delayed_retry(
    *,
    queue: str | None = None,
    max_retries: int = 5,
    wait: wait_base = DEFAULT_WAIT,
    retry: retry_base | None = None,
    stop: stop_base | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    parking_queue: str | None = None,
    publish_timeout: Duration = DEFAULT_PUBLISH_TIMEOUT,
    instrumentation: Instrumentation | None = None,
) -> Callable[[Callable[P, Awaitable[object]]], RetryingHandler[P]]: ...


def with_delayed_retry(
    fn: Callable[P, Awaitable[object]] | None = None,
    /,
    *,
    queue: str | None = None,
    max_retries: int = 5,
    wait: wait_base = DEFAULT_WAIT,
    retry: retry_base | None = None,
    stop: stop_base | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    parking_queue: str | None = None,
    publish_timeout: Duration = DEFAULT_PUBLISH_TIMEOUT,
    instrumentation: Instrumentation | None = None,
) -> RetryingHandler[P] | Callable[[Callable[P, Awaitable[object]]], RetryingHandler[P]]:
    """Wrap an aio-pika consumer handler with delayed retries and parking.

    Use it on any handler that may fail for reasons that pass: it acks on
    success, and on failure sends the message through the delay chain to
    come back to ``queue`` after the backoff, or to the parking queue once
    retries are spent. Works with and without parentheses.

    Options (keyword-only, checked when decorating):
      queue: the queue this handler consumes; retries return there. Leave it
        out only when consuming with :func:`consume`, which sets it.
      max_retries: delayed retries after the first failure before parking.
      wait: a tenacity wait strategy (default: exponential 1 s … 1 h, jittered).
      retry: a tenacity ``retry_if_*`` choosing which exceptions are retried;
        the others park at once (default: every ``Exception``).
      stop: an extra tenacity ``stop_*``, e.g. ``stop_after_delay(86400)``.
      topology: the :class:`DelayTopology` (prefix, levels, unit, queue type).
      parking_queue: where parked messages go (default ``<queue>.parking``).
      publish_timeout: how long to wait for a publisher confirm.
      instrumentation: telemetry (default: OpenTelemetry through the global
        providers, a no-op until an SDK is configured).
    """
    if not isinstance(topology, DelayTopology):
        raise ConfigurationError(f"topology={topology!r} must be a DelayTopology")
    if queue is not None:
        topology.check_destination(queue)
    if parking_queue is not None and (not parking_queue or parking_queue.startswith("amq.")):
        raise ConfigurationError(f"parking_queue={parking_queue!r} is not a usable queue name")
    if instrumentation is not None and not callable(getattr(instrumentation, "attempt", None)):
        raise ConfigurationError(
            f"instrumentation={instrumentation!r} is not an Instrumentation; pass "
            "delayed_retry.NoInstrumentation() or an object with attempt() and scheduling()"
        )
    policy_kwargs: dict[str, Any] = {"max_retries": max_retries, "wait": wait, "stop": stop}
    if retry is not None:
        policy_kwargs["retry"] = retry
    options = RetryOptions(
        queue=queue,
        policy=RetryPolicy(**policy_kwargs),
        topology=topology,
        parking_queue=parking_queue,
        publish_timeout=to_seconds(publish_timeout, name="publish_timeout")
        or DEFAULT_PUBLISH_TIMEOUT,
        instrumentation=instrumentation or default_instrumentation(),
    )

    def decorate(func: Callable[P, Awaitable[object]]) -> RetryingHandler[P]:
        if not callable(func):
            raise ConfigurationError(f"@with_delayed_retry needs an async function, got {func!r}")
        return RetryingHandler(func, options)

    return decorate(fn) if fn is not None else decorate


async def consume(
    queue: AbstractQueue,
    handler: RetryingHandler[[AbstractIncomingMessage]],
    **consume_kwargs: Any,
) -> str:
    """Consume ``queue`` with ``handler``, telling it the queue so retries come back here.

    Declares the topology, the queue's binding and its parking queue first,
    so a misconfiguration fails here and not at the first failure, and warns
    when the queue's delivery limit (as declared through ``queue``) could drop
    messages before they are parked (:mod:`delayed_retry.checks`). Returns
    the consumer tag.
    """
    if not isinstance(handler, RetryingHandler):
        raise ConfigurationError(
            f"{handler!r} is not wrapped with @with_delayed_retry; decorate it first"
        )
    if handler.options.queue not in (None, queue.name):
        raise ConfigurationError(
            f"{handler!r} was configured for queue {handler.options.queue!r} but is consuming "
            f"{queue.name!r}; drop queue= from the decorator or consume the queue it names"
        )
    bound = handler.for_queue(queue.name)
    underlay = await underlay_of(queue.channel)
    if not getattr(underlay, "publisher_confirms", False):
        # Every hand-over would fail on its first failure and leave the message unacked.
        raise ConfigurationError(
            f"queue {queue.name!r} is consumed on a channel without publisher confirms, so "
            f"{handler!r} could never know a retry was handed over; open the channel with "
            "connection.channel(publisher_confirms=True), aio-pika's default"
        )
    await bound.declare(queue.channel)
    underlay = await underlay_of(queue.channel)
    warn_about_delivery_limit(
        queue=queue.name,
        arguments=getattr(queue, "arguments", None),
        max_retries=handler.options.policy.max_retries,
        server_properties=getattr(underlay.connection, "server_properties", None),
    )
    return await queue.consume(bound, **consume_kwargs)
