"""The handler ``@with_delayed_retry`` makes: one delivery from arrival to settlement.

:class:`RetryingHandler` declares what its queue needs on first use per
connection, holds a message that left the chain early until due, runs the
handler (immediate retries included), acks on success and, on failure, lets
:class:`~delayed_retry.consumer.failures.FailureHandling` carry out the
policy's decision (publish the copy with confirms, then ack). The whole
delivery runs in :meth:`RetryingHandler.__call__`, one frame: the success path
pays for every frame, and a retry reaches ``basic_publish`` in a few.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, Generic, ParamSpec

import aiormq
import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.consumer.crash_guard import guard_redelivery
from delayed_retry.consumer.failures import FailureHandling
from delayed_retry.consumer.handover import ack
from delayed_retry.consumer.hold import early_tolerance, hold_until_due
from delayed_retry.consumer.immediate import pause_before_rerun
from delayed_retry.consumer.put_back import cancel_consumer_of, put_back
from delayed_retry.consumer.rescue import rescue
from delayed_retry.consumer.retry_state import CURRENT_STATE, LazyRetryState
from delayed_retry.consumer.settings import RetryOptions
from delayed_retry.consumer.settlement import GuardedMessage
from delayed_retry.consumer.throttle import ThrottleControl
from delayed_retry.durations import utcnow
from delayed_retry.errors import ConfigurationError, HandlerCancelledError
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.observability.instrumentation import QUIET_SCOPE, AttemptScope
from delayed_retry.recovery.policy import Decision

__all__ = ["RetryingHandler"]

log = logging.getLogger(__name__)

P = ParamSpec("P")


class RetryingHandler(Generic[P]):
    """An aio-pika consumer callback that retries its handler through the delay chain.

    Made by :func:`~delayed_retry.with_delayed_retry`; pass it to ``queue.consume``. Its
    last positional argument must be the ``AbstractIncomingMessage``.
    """

    def __init__(self, fn: Callable[P, Awaitable[object]], options: RetryOptions) -> None:
        self.fn = fn
        self.options = options
        # updated=(): copying a callable instance's __dict__ would overwrite fn and options.
        functools.update_wrapper(self, fn, updated=())
        # The connection whose declarations are known done: checked without awaiting.
        self._declared_on: weakref.ref[object] | None = None
        # An instrumentation may say it records nothing now (OpenTelemetry without an SDK).
        self._telemetry_on: Callable[[], bool] = getattr(
            options.instrumentation, "enabled", _always
        )
        self.throttle: ThrottleControl | None = (
            ThrottleControl(
                options.throttle,
                queue=options.queue,
                topology=options.topology,
                publish_timeout=options.publish_timeout,
                meter_provider=getattr(options.instrumentation, "meter_provider", None),
            )
            if options.throttle is not None and options.queue is not None
            else None
        )
        # Built at the first failure, then kept: every failure of this queue uses it.
        self._failure_handling: FailureHandling | None = None

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", self.fn)
        return f"<RetryingHandler {name!r} queue={self.options.queue!r}>"

    def for_queue(self, queue: str) -> RetryingHandler[P]:
        """The same handler, retrying to ``queue``: for one handler consuming several queues."""
        if queue == self.options.queue:
            return self  # one handler, one throttle: its state is the one the caller sees
        self.options.topology.check_destination(queue)
        return RetryingHandler(self.fn, replace(self.options, queue=queue))

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        bound = RetryingHandler(self.fn.__get__(obj, objtype), self.options)
        return bound

    async def declare(self, channel: aiormq.abc.AbstractChannel | Any) -> None:
        """Declare the topology, the queue binding and the parking queue now, not on first use."""
        underlay = await underlay_channel(channel)
        await self._declare_on(underlay.connection, self._queue())

    async def _declare_on(self, connection: aiormq.abc.AbstractConnection, queue: str) -> None:
        opts = self.options
        declarer = declarer_for(connection)
        await declarer.destination(connection, opts.topology, queue, opts.parking_queue)
        if opts.dead_letter_queue is not None:
            spec = opts.topology.dead_letter_queue_spec(opts.dead_letter_queue)
            await declarer.queue(connection, spec)

    def _failures(self, queue: str) -> FailureHandling:
        failures = self._failure_handling
        if failures is not None and failures.queue == queue:
            return failures
        failures = self._build_failures(queue)
        if queue == self.options.queue:
            self._failure_handling = failures
        return failures

    def _build_failures(self, queue: str) -> FailureHandling:
        opts = self.options
        return FailureHandling(
            queue=queue,
            topology=opts.topology,
            parking_queue=opts.parking_queue,
            publish_timeout=opts.publish_timeout,
            requeue_backoff=opts.requeue_backoff,
            return_to=opts.return_to,
            hold=opts.hold,
            record_runs=opts.immediate is not None,
            hooks=opts.hooks,
            timing=opts.timing,
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
        if isinstance(message, GuardedMessage):  # stacked decorators: settle the real message
            message = message.message
        if not isinstance(message, AbstractIncomingMessage):
            raise TypeError(
                f"{self!r} was called without an aio-pika message as its last positional argument"
            )
        if message.processed:
            raise ConfigurationError(
                f"{self!r} got message {message.message_id} already settled: it is consumed with "
                "no_ack=True, so a failure could not be retried without losing it; consume with "
                "no_ack=False (aio-pika's default)"
            )
        queue = self._queue()
        guarded = GuardedMessage(message)
        call_args: tuple[Any, ...] = (*args[:-1], guarded)
        # Read from the headers only when something needs it: the success path parses nothing.
        cell = LazyRetryState(message, queue)
        # One frame from here to the hand-over: the success path pays for every frame, and
        # every frame is one more to read on a retry's way to the broker.
        try:
            opts = self.options
            connection = message.channel.connection
            if self._declared_on is None or self._declared_on() is not connection:
                # First use on this connection: declare what we need. A failure is requeued
                # after a backoff (rescue): nothing is lost, nothing spins.
                await self._declare_on(connection, queue)
                self._declared_on = weakref.ref(connection)
            if opts.crash_guard is not None:
                if opts.held.stopping:  # shutting down: back to the queue, not counted as a crash
                    await cancel_consumer_of(message)
                    await self._put_back(message, queue)
                    return
                if message.redelivered:  # its last consumer went away holding it
                    await guard_redelivery(
                        message, cell.get(), guard=opts.crash_guard, failures=self._failures(queue)
                    )
                    return
            if opts.topology.is_chain_exchange(message.exchange):
                due_at = cell.get().due_at
                if due_at is not None and not await self._wait_until_due(message, due_at, queue):
                    return
            throttle = self.throttle
            if throttle is not None and not await throttle.admit(message):
                return  # throttled: put back at the tail of its queue, unhandled
            immediate = opts.immediate
            started = time.monotonic() if immediate is not None else 0.0
            paused = 0.0
            while True:
                pause: float | None = None
                observed: contextlib.AbstractContextManager[AttemptScope] = (
                    opts.instrumentation.attempt(message, cell.get(), queue=queue)
                    if self._telemetry_on()
                    else QUIET_SCOPE
                )
                with observed as scope:
                    # Inline, not a helper coroutine: the success path pays for every frame.
                    token = CURRENT_STATE.set(cell)
                    failure: Exception | None = None
                    try:
                        await self.fn(*call_args, **kwargs)
                    except asyncio.CancelledError as exc:
                        task = asyncio.current_task()
                        if task is not None and task.cancelling():
                            raise
                        failure = HandlerCancelledError(
                            f"handler {self!r} raised CancelledError without being cancelled"
                        )
                        failure.__cause__ = exc
                    except Exception as exc:
                        failure = exc
                    finally:
                        CURRENT_STATE.reset(token)
                    if failure is None:
                        opts.requeue_backoff.reset()
                        if throttle is not None:
                            throttle.observe(message, None)
                        if guarded.deferred is not None:
                            # The handler rejected or nacked without raising: its explicit choice.
                            await guarded.send_deferred()
                            scope.finish("error", reason="settled-by-handler")
                            return
                        if opts.ack_on_success and not message.processed:
                            # Handled: a failed ack means a redelivery (a duplicate), never a park.
                            await ack(message, queue)
                        scope.finish("success")
                        return
                    if guarded.acked or message.processed:
                        log.error(
                            "handler %r acked message %s itself and then raised %r; the ack "
                            "stands, so it is neither retried nor parked",
                            self,
                            message.message_id,
                            failure,
                        )
                        scope.finish("error", exc=failure, reason="settled-by-handler")
                        return
                    # A reject or nack the handler asked for on its way out (message.process())
                    # is dropped: the failure is retried or parked like any other.
                    state = cell.get()
                    if immediate is not None:
                        pause = immediate.next_pause(
                            opts.policy,
                            state,
                            failure,
                            now=utcnow(),
                            running_for=time.monotonic() - started,
                            paused=paused,
                        )
                    if pause is None:
                        if throttle is not None:  # a delivery's failure, immediate retries spent
                            throttle.observe(message, failure)
                        decision, failure = self._decide(message, state, failure)
                        try:
                            guarded.handed_over = await self._failures(queue).failed(
                                message, state, failure, decision, scope
                            )
                        finally:
                            # The failure's traceback holds this frame, and this frame the
                            # failure: a cycle per failed message for the collector to find.
                            failure = None
                        return
                    scope.finish("immediate-retry", delay=pause, exc=failure)
                log.info(
                    "message %s on queue %r failed (%s); running it again at once (immediate retry "
                    "%d of %d)",
                    message.message_id,
                    queue,
                    type(failure).__name__,
                    state.immediate_retries + 1,
                    immediate.times if immediate is not None else 0,
                )
                if not await pause_before_rerun(
                    opts.pauses,
                    message,
                    pause,
                    queue=queue,
                    put_back=(
                        None
                        if opts.crash_guard is None
                        else functools.partial(self._put_back, queue=queue)
                    ),
                ):
                    return
                paused += pause
                guarded.deferred = None  # the failed run's reject or nack was dropped
                cell.rerun()
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # shutting down: the channel closes and the broker redelivers it
            await rescue(message, exc, failures=self._failures(queue), read_state=cell.get)
        except Exception as exc:
            await rescue(message, exc, failures=self._failures(queue), read_state=cell.get)

    def _decide(
        self, message: AbstractIncomingMessage, state: RetryState, failure: Exception
    ) -> tuple[Decision, Exception]:
        """The policy's decision on ``failure``, and the failure the record shows.

        A policy that fails parks the message as ``internal-error`` with its own exception.
        """
        try:
            return self.options.policy.decide(state, failure, now=utcnow()), failure
        except Exception as policy_exc:
            log.exception(
                "the retry policy of %r failed on message %s; parking it",
                self,
                message.message_id,
            )
            policy_exc.__context__ = failure  # the record shows both tracebacks
            return Decision.park("internal-error"), policy_exc

    async def _put_back(self, message: AbstractIncomingMessage, queue: str) -> None:
        await put_back(
            message,
            queue,
            topology=self.options.topology,
            publish_timeout=self.options.publish_timeout,
        )

    async def release_held(self) -> int:
        """Requeue every message this handler holds (``nack``, requeue) at once.

        Call it when shutting a consumer down gracefully, after cancelling the
        consumer and before closing the channel: the messages held until due,
        and those pausing between immediate retries, go back to their queue now
        instead of when their wait ends (a closed channel returns them too).
        Returns how many were released. With a crash guard, messages held until
        due, and every message that reaches the handler afterwards, are put back
        as new messages, so that the shutdown counts as no crash; a throttle
        stops probing.
        """
        if self.throttle is not None:
            await self.throttle.stop()
        return self.options.held.release() + self.options.pauses.release()

    async def _wait_until_due(
        self, message: AbstractIncomingMessage, due_at: datetime, queue: str
    ) -> bool:
        """Hold a message that came out of the chain early until due; ``False`` if settled here.

        Within ``hold.limit`` of its due time (and while fewer than
        ``hold.max_messages`` are held) it waits here, unacked; earlier, it goes
        back into the chain for the rest of its wait. Without a hold, a message
        at most :func:`early_tolerance` early is handled at once.
        """
        opts = self.options
        outcome = await hold_until_due(
            opts.held,
            opts.hold,
            message,
            due_at,
            max_delay=opts.topology.max_delay,
            tolerance=early_tolerance(opts.topology),
            put_back=(
                None if opts.crash_guard is None else functools.partial(self._put_back, queue=queue)
            ),
        )
        if outcome != "early":
            return outcome == "due"
        await self._failures(queue).redelay(message, due_at)
        return False


def _always() -> bool:
    return True
