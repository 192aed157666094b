"""The handler ``@with_delayed_retry`` makes: one delivery from arrival to settlement.

:meth:`RetryingHandler.__call__` runs a delivery in named steps: the
preflight (declare on first use per connection, the crash guard, hold until
due, the throttle), the attempt (the handler, with immediate retries inside
it), and its outcome: success (the outbox released when there is one, then the
ack), or a failure that
:class:`~delayed_retry.consumer.failures.FailureHandling` retries through
the chain or parks (the copy confirmed, then the ack).
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

from delayed_retry.amqp.channels import scratch_channel, underlay_channel
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.consumer.crash_guard import guard_redelivery
from delayed_retry.consumer.failures import FailureHandling
from delayed_retry.consumer.handover import ack, hand_over
from delayed_retry.consumer.hold import early_tolerance, hold_until_due
from delayed_retry.consumer.immediate import pause_before_rerun
from delayed_retry.consumer.order_partition import Outcome
from delayed_retry.consumer.ordering import KeyOrdering
from delayed_retry.consumer.outbox import CURRENT_OUTBOX, Outbox
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
        # A crash guard or a throttle sees every delivery before the handler does.
        self._guarded = options.crash_guard is not None or self.throttle is not None
        # Built at the first failure, then kept: every failure of this queue uses it.
        self._failure_handling: FailureHandling | None = None
        ordering = options.ordering
        self._ordering: KeyOrdering | None = (
            None
            if ordering is None or options.queue is None
            else KeyOrdering(
                ordering.ordered_by,
                queue=options.queue,
                release_after=ordering.release_after,
                publish_timeout=options.publish_timeout,
            )
        )

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
            before_retry=None if self._ordering is None else self._ordering.record_block,
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
        """Handle one delivery: the preflight, then the attempt and its outcome.

        A failure of the library itself (not of the handler) is rescued: the
        message is parked, else requeued after a backoff; nothing is lost.
        """
        message = self._message_of(args)
        if self._ordering is None:
            await self._handle(message, args[:-1], kwargs)
        else:  # in its key's order: now, or behind the key's message waiting in the chain
            run = functools.partial(self._handle, args=args[:-1], kwargs=kwargs)
            await self._ordering.deliver(message, run)

    async def _handle(
        self, message: AbstractIncomingMessage, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Outcome:
        """The preflight, then the attempt; how the delivery ended."""
        queue = self._queue()
        # Read from the headers only when something needs it: the success path parses nothing.
        cell = LazyRetryState(message, queue)
        try:
            if self._needs_preflight(message) and not await self._preflight(message, queue, cell):
                return "requeued"
            return await self._attempt(message, queue, cell, args, kwargs)
        except asyncio.CancelledError as exc:
            if _cancelling():
                raise  # shutting down: the channel closes and the broker redelivers it
            await rescue(message, exc, failures=self._failures(queue), read_state=cell.get)
        except Exception as exc:
            await rescue(message, exc, failures=self._failures(queue), read_state=cell.get)
        return "requeued"  # or parked as internal-error: an ordered key then waits its release

    def _message_of(self, args: tuple[Any, ...]) -> AbstractIncomingMessage:
        """The delivery this call handles: the last positional argument, unsettled."""
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
        return message

    def _needs_preflight(self, message: AbstractIncomingMessage) -> bool:
        """Whether :meth:`_preflight` has anything to do: checked on every delivery, no await."""
        declared = self._declared_on
        return (
            self._guarded
            or declared is None
            or declared() is not message.channel.connection
            or self.options.topology.is_chain_exchange(message.exchange)
        )

    async def _preflight(
        self, message: AbstractIncomingMessage, queue: str, cell: LazyRetryState
    ) -> bool:
        """Before the handler: declare, guard against crashes, hold until due, throttle.

        ``False`` when the message was settled (or put back) here and must not run.
        """
        connection = message.channel.connection
        if self._declared_on is None or self._declared_on() is not connection:
            # First use on this connection. A failure is requeued after a backoff (rescue).
            await self._declare_on(connection, queue)
            self._declared_on = weakref.ref(connection)
        opts = self.options
        if opts.crash_guard is not None and not await self._guard_crashes(message, queue, cell):
            return False
        if opts.topology.is_chain_exchange(message.exchange):
            due_at = cell.get().due_at
            if due_at is not None and not await self._wait_until_due(message, due_at, queue):
                return False
        # Throttled: put back at the tail of its queue, unhandled.
        return self.throttle is None or await self.throttle.admit(message)

    async def _guard_crashes(
        self, message: AbstractIncomingMessage, queue: str, cell: LazyRetryState
    ) -> bool:
        """Put back a message that arrives while stopping; judge one a crashed consumer held."""
        opts = self.options
        assert opts.crash_guard is not None
        if opts.held.stopping:  # shutting down: back to the queue, not counted as a crash
            await cancel_consumer_of(message)
            await self._put_back(message, queue)
            return False
        if message.redelivered:  # its last consumer went away holding it
            await guard_redelivery(
                message, cell.get(), guard=opts.crash_guard, failures=self._failures(queue)
            )
            return False
        return True

    async def _attempt(
        self,
        message: AbstractIncomingMessage,
        queue: str,
        cell: LazyRetryState,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Outcome:
        """Run the handler, again at once while immediate retries allow; then its outcome."""
        opts = self.options
        guarded = GuardedMessage(message)
        call_args: tuple[Any, ...] = (*args, guarded)
        started = time.monotonic() if opts.immediate is not None else 0.0
        paused = 0.0
        while True:
            with self._scope(message, cell, queue) as scope:
                token = CURRENT_STATE.set(cell)
                # Each run holds its own publishes: a failed run's are dropped with it.
                outbox = Outbox(message) if opts.outbox else None
                holding = None if outbox is None else CURRENT_OUTBOX.set(outbox)
                try:
                    await self.fn(*call_args, **kwargs)
                    failure: Exception | None = None
                except asyncio.CancelledError as exc:
                    failure = self._cancelled(exc)
                except Exception as exc:
                    failure = exc
                finally:
                    CURRENT_STATE.reset(token)
                    if holding is not None:
                        CURRENT_OUTBOX.reset(holding)
                if failure is None:
                    return await self._succeeded(message, queue, guarded, scope, outbox)
                if self._settled_by_handler(message, guarded, failure, scope):
                    return "done"
                pause = self._immediate_pause(cell, failure, started, paused)
                if pause is None:
                    try:
                        return await self._failed(message, queue, guarded, cell, failure, scope)
                    finally:
                        # The failure's traceback holds this frame, and this frame the
                        # failure: a cycle per failed message for the collector to find.
                        failure = None
                scope.finish("immediate-retry", delay=pause, exc=failure)
            if not await self._pause_before_rerun(message, queue, cell, failure, pause):
                return "requeued"
            paused += pause
            guarded.deferred = None  # the failed run's reject or nack was dropped
            cell.rerun()

    def _scope(
        self, message: AbstractIncomingMessage, cell: LazyRetryState, queue: str
    ) -> contextlib.AbstractContextManager[AttemptScope]:
        """The instrumentation's scope of one handler run; a free one while nothing records."""
        if self._telemetry_on():
            return self.options.instrumentation.attempt(message, cell.get(), queue=queue)
        return QUIET_SCOPE

    def _cancelled(self, exc: asyncio.CancelledError) -> Exception:
        """The failure of a handler that raised ``CancelledError``; re-raised when cancelled."""
        if _cancelling():
            raise exc
        failure = HandlerCancelledError(
            f"handler {self!r} raised CancelledError without being cancelled"
        )
        failure.__cause__ = exc
        return failure

    async def _succeeded(
        self,
        message: AbstractIncomingMessage,
        queue: str,
        guarded: GuardedMessage,
        scope: AttemptScope,
        outbox: Outbox | None = None,
    ) -> Outcome:
        """The outcome of a success: ack (after the outbox's publishes), or the reject or nack
        the handler asked for (the outbox's publishes dropped)."""
        opts = self.options
        if opts.requeue_backoff.in_a_row:  # a handled delivery ends a run of requeues
            opts.requeue_backoff.reset()
        if self.throttle is not None:
            self.throttle.observe(message, None)
        if guarded.deferred is not None:
            # The handler rejected or nacked without raising: its explicit choice.
            requeued = guarded.deferred.requeue
            await guarded.send_deferred()
            scope.finish("error", reason="settled-by-handler")
            return "requeued" if requeued else "done"
        if outbox is not None and outbox.held:
            await self._release(message, queue, outbox)
            if not outbox.released:
                return "requeued"
        elif opts.ack_on_success and not message.processed:
            # Handled: a failed ack means a redelivery (a duplicate), never a park.
            await ack(message, queue)
        scope.finish("success")
        return "done"

    async def _release(self, message: AbstractIncomingMessage, queue: str, outbox: Outbox) -> None:
        """Publish what the handler held, confirmed and in order, then ack: the one hand-over.

        Unconfirmed, the message stays unacked while the publishes are tried again,
        then goes back to its queue (:attr:`Outbox.released` stays ``False``).
        """
        opts = self.options
        if message.processed:  # acked by the handler itself: nothing is held back any more
            log.warning(
                "handler %r acked message %s itself, with outbox=True: its %d held message(s) "
                "are published after that ack, so a crash now loses them; leave the ack to the "
                "library",
                self,
                message.message_id,
                len(outbox.held),
            )
            outbox.released = await _publish_held(message, outbox, opts.publish_timeout)
            return
        release = functools.partial(_publish_held, message, outbox, opts.publish_timeout)
        outbox.released = await hand_over(message, release, queue=queue, timing=opts.timing) is True

    def _settled_by_handler(
        self,
        message: AbstractIncomingMessage,
        guarded: GuardedMessage,
        failure: Exception,
        scope: AttemptScope,
    ) -> bool:
        """Whether the handler acked its message and then raised: the ack stands, logged."""
        if not (guarded.acked or message.processed):
            return False
        log.error(
            "handler %r acked message %s itself and then raised %r; the ack stands, so it "
            "is neither retried nor parked",
            self,
            message.message_id,
            failure,
        )
        scope.finish("error", exc=failure, reason="settled-by-handler")
        return True

    def _immediate_pause(
        self, cell: LazyRetryState, failure: Exception, started: float, paused: float
    ) -> float | None:
        """The pause before running the handler again at once; ``None``: no immediate retry."""
        opts = self.options
        if opts.immediate is None:
            return None
        return opts.immediate.next_pause(
            opts.policy,
            cell.get(),
            failure,
            now=utcnow(),
            running_for=time.monotonic() - started,
            paused=paused,
        )

    async def _failed(
        self,
        message: AbstractIncomingMessage,
        queue: str,
        guarded: GuardedMessage,
        cell: LazyRetryState,
        failure: Exception,
        scope: AttemptScope,
    ) -> Outcome:
        """The outcome of a failure, immediate retries spent: a retry through the chain, or parking.

        A reject or nack the handler asked for on its way out (``message.process()``)
        is dropped: the failure is retried or parked like any other.
        """
        if self.throttle is not None:  # a delivery's failure
            self.throttle.observe(message, failure)
        state = cell.get()
        decision, failure = self._decide(message, state, failure)
        handed_over = await self._failures(queue).failed(message, state, failure, decision, scope)
        guarded.handed_over = handed_over
        if handed_over is None:
            return "requeued"
        return "retried" if handed_over.action == "retry" else "done"

    async def _pause_before_rerun(
        self,
        message: AbstractIncomingMessage,
        queue: str,
        cell: LazyRetryState,
        failure: Exception,
        pause: float,
    ) -> bool:
        """Wait ``pause`` before an immediate retry; ``False`` when the message was put back."""
        log.info(
            "message %s on queue %r failed (%s); running it again at once (immediate retry "
            "%d of %d)",
            message.message_id,
            queue,
            type(failure).__name__,
            cell.get().immediate_retries + 1,
            self.options.immediate.times if self.options.immediate is not None else 0,
        )
        return await pause_before_rerun(
            self.options.pauses, message, pause, queue=queue, put_back=self._put_back_for(queue)
        )

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

    def _put_back_for(
        self, queue: str
    ) -> Callable[[AbstractIncomingMessage], Awaitable[None]] | None:
        """How a held message goes back to ``queue`` as new; ``None`` without a crash guard."""
        if self.options.crash_guard is None:
            return None
        return functools.partial(self._put_back, queue=queue)

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
            put_back=self._put_back_for(queue),
        )
        if outcome != "early":
            return outcome == "due"
        await self._failures(queue).redelay(message, due_at)
        return False


def _always() -> bool:
    return True


def _cancelling() -> bool:
    """Whether the running task is being cancelled (not a handler's stray ``CancelledError``)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _publish_held(message: AbstractIncomingMessage, outbox: Outbox, timeout: float) -> bool:
    """Release ``outbox`` on a confirm channel of its own: a publish the broker refuses (a
    missing exchange) closes that channel, not the one the message and its neighbours came on."""
    async with scratch_channel(message.channel.connection, confirms=True) as own:
        return await outbox.release(own, timeout=timeout)
