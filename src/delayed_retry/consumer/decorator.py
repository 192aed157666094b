"""``@with_delayed_retry``: retries for aio-pika consumers, through the delay chain.

The decorator and the handler it makes: read the retry state, run the
handler, ack on success, and on failure let :mod:`delayed_retry.consumer.failures`
carry out the policy's decision (publish the copy with confirms, then ack).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Unpack, overload

import aiormq
import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.amqp.consumers import check_restorable, start_consumer
from delayed_retry.amqp.declare import declarer_for
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.consumer.crash_guard import guard_redelivery
from delayed_retry.consumer.failures import FailureHandling
from delayed_retry.consumer.handover import (
    DEFAULT_TIMING,
    HandOverTiming,
    Trouble,
    ack,
    channel_open,
)
from delayed_retry.consumer.hooks import FailureHooks
from delayed_retry.consumer.immediate import Pauses, pause_before_rerun
from delayed_retry.consumer.options import (
    HandlerOptions,
    ReturnTo,
    SubscriberOptions,
    with_defaults,
)
from delayed_retry.consumer.put_back import cancel_consumer_of, put_back
from delayed_retry.consumer.settlement import GuardedMessage
from delayed_retry.consumer.throttling import ThrottleControl
from delayed_retry.consumer.until_due import HeldUntilDue, hold_until_due
from delayed_retry.crashes import CrashGuard
from delayed_retry.delivery_limits import warn_about_delivery_limit
from delayed_retry.durations import to_seconds, utcnow
from delayed_retry.errors import ConfigurationError, DelayedRetryError
from delayed_retry.headers.retry_state import RetryState, parse_retry_state
from delayed_retry.hold import Hold, check_hold
from delayed_retry.immediate import ImmediateRetries
from delayed_retry.observability.instrumentation import (
    QUIET_SCOPE,
    AttemptScope,
    Instrumentation,
)
from delayed_retry.observability.otel import default_instrumentation
from delayed_retry.policy import Decision, RetryPolicy
from delayed_retry.throttle import Throttle
from delayed_retry.topology import DelayTopology
from delayed_retry.work_queues import dead_letter_target

__all__ = [
    "RetryingHandler",
    "RetryOptions",
    "consume",
    "retry_options",
    "current_retry_state",
    "retry_state",
    "retry_state_scope",
    "with_delayed_retry",
    "EARLY_TOLERANCE",
    "HandlerCancelledError",
    "early_tolerance",
]

log = logging.getLogger(__name__)

P = ParamSpec("P")


class _StateCell:
    """The retry state of one delivery, read from its headers only when something asks.

    A message that succeeds on its first attempt never needs it: the success
    path parses no headers. Header problems are logged when the state is read.
    """

    __slots__ = ("_message", "_queue", "_rerun", "_state")

    def __init__(self, message: AbstractIncomingMessage, queue: str) -> None:
        self._message = message
        self._queue = queue
        self._state: RetryState | None = None
        self._rerun: RetryState | None = None

    def rerun(self) -> None:
        """One more immediate retry of this delivery: the state says so from now on."""
        state = self._rerun or self.get()
        self._rerun = replace(state, immediate_retries=state.immediate_retries + 1)

    def get(self) -> RetryState:
        if self._rerun is not None:
            return self._rerun
        if self._state is None:
            message = self._message
            self._state = state = parse_retry_state(
                message.headers,
                exchange=message.exchange,
                routing_key=message.routing_key,
                queue=self._queue,
            )
            for problem in state.problems:
                log.warning("message %s on queue %r: %s", message.message_id, self._queue, problem)
        return self._state


_current_state: contextvars.ContextVar[_StateCell | None] = contextvars.ContextVar(
    "delayed_retry_state", default=None
)

EARLY_TOLERANCE = timedelta(milliseconds=50)
"""Without a hold, a message arriving at most this much before its due time is handled
now, and never less than one unit of the topology (see :func:`early_tolerance`); one
arriving earlier is sent back for the rest of the wait."""


def early_tolerance(topology: DelayTopology) -> timedelta:
    """Without a hold, how early a message may arrive and be handled now: 50 ms, or one unit.

    Sending back a message due in less than one unit would cost it a whole
    unit more in the chain (delays are rounded up to units).
    """
    return max(EARLY_TOLERANCE, timedelta(milliseconds=topology.unit_ms))


class HandlerCancelledError(DelayedRetryError):
    """A handler raised ``CancelledError`` although its task was not being cancelled."""


def current_retry_state() -> RetryState | None:
    """The retry state of the message being handled by this task, inside a wrapped handler."""
    cell = _current_state.get()
    return None if cell is None else cell.get()


@contextlib.contextmanager
def retry_state_scope(
    message: AbstractIncomingMessage, queue: str, *, immediate_retries: int = 0
) -> Iterator[None]:
    """Make :func:`current_retry_state` answer for ``message`` inside the block.

    For a front end that runs a handler without a broker to hand failures to
    (FastStream's in-memory test client); :class:`RetryingHandler` does the same
    around every attempt. The headers are read only if something asks.
    ``immediate_retries``: how many this run of the delivery follows.
    """
    cell = _StateCell(message, queue)
    for _ in range(immediate_retries):
        cell.rerun()
    token = _current_state.set(cell)
    try:
        yield
    finally:
        _current_state.reset(token)


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
    trouble: Trouble = field(default_factory=Trouble, compare=False, repr=False)
    """Consecutive messages given back unhandled, for the backoff before each requeue."""
    return_to: ReturnTo
    hold: Hold | None
    held: HeldUntilDue = field(default_factory=HeldUntilDue, compare=False, repr=False)
    """The messages this handler holds until due right now (shared by its per-queue copies)."""
    ack_on_success: bool = True
    """Whether a handler that returns is acked here. ``False`` leaves that to the caller: a
    framework that acks after publishing the handler's result (FastStream)."""
    immediate: ImmediateRetries | None = None
    """Immediate retries before a failure goes on to the policy; ``None``: none."""
    pauses: Pauses = field(default_factory=Pauses, compare=False, repr=False)
    """The messages this handler is pausing between immediate runs right now."""
    hooks: FailureHooks | None = None
    """``on_retry`` / ``on_park``, called after each confirmed hand-over."""
    dead_letter_queue: str | None = None
    """Where the consumed queue's broker dead-letters past its delivery limit, when its
    arguments say so (:func:`~delayed_retry.work_queues.work_queue_arguments`): declared with
    the queue's binding, so the broker has somewhere to put what no consumer could take."""
    throttle: Throttle | None = None
    """When to stop taking messages after a run of failures, and how to probe (``None``: never)."""
    crash_guard: CrashGuard | None = None
    """How many times a message may take its consumer down before it is parked (``None``: off)."""
    timing: HandOverTiming = DEFAULT_TIMING
    """How long an unconfirmed hand-over is tried and how long a message is kept before it
    goes back (tests pass short ones)."""


class RetryingHandler(Generic[P]):
    """An aio-pika consumer callback that retries its handler through the delay chain.

    Made by :func:`with_delayed_retry`; pass it to ``queue.consume``. Its
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
            trouble=opts.trouble,
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
        cell = _StateCell(message, queue)
        # One frame from here to the hand-over: the success path pays for every frame, and
        # every frame is one more to read on a retry's way to the broker.
        try:
            opts = self.options
            connection = message.channel.connection
            if self._declared_on is None or self._declared_on() is not connection:
                # First use on this connection: declare what we need. A failure is given back
                # to the queue after a backoff (_rescue): nothing is lost, nothing spins.
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
                    token = _current_state.set(cell)
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
                        _current_state.reset(token)
                    if failure is None:
                        opts.trouble.clear()
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
                    give_back=(
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
            await self._rescue(message, queue, cell, exc)
        except Exception as exc:
            await self._rescue(message, queue, cell, exc)

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
        """Give back every message this handler holds (``nack``, requeue) at once.

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
            give_back=(
                None if opts.crash_guard is None else functools.partial(self._put_back, queue=queue)
            ),
        )
        if outcome != "early":
            return outcome == "due"
        await self._failures(queue).redelay(message, due_at)
        return False

    async def _rescue(
        self,
        message: AbstractIncomingMessage,
        queue: str,
        cell: _StateCell,
        exc: BaseException,
    ) -> None:
        """Settle a message after the library itself failed: park it, else give it back later."""
        log.error(
            "delayed-retry failed while handling message %s from queue %r",
            message.message_id,
            queue,
            exc_info=exc,
        )
        if message.processed:
            return
        if not channel_open(message):
            log.warning(
                "the channel of message %s is closed; the broker will deliver it again",
                message.message_id,
            )
            return
        opts = self.options
        failures = self._failures(queue)
        channel = message.channel
        declared = declarer_for(channel.connection).has_destination(
            opts.topology, queue, opts.parking_queue
        )
        if declared and getattr(channel, "publisher_confirms", False):
            try:
                state = cell.get()
            except Exception:  # headers unreadable: park with the record alone
                state = parse_retry_state(
                    None, exchange=message.exchange, routing_key=message.routing_key, queue=queue
                )
            try:
                await failures.park_now(message, state, exc, "internal-error")
                return
            except Exception as park_err:
                log.error(
                    "could not park message %s after an internal error (%r)",
                    message.message_id,
                    park_err,
                )
        await failures.give_back_later(message, exc)


def _always() -> bool:
    return True


@overload
def with_delayed_retry(fn: Callable[P, Awaitable[object]], /) -> RetryingHandler[P]: ...


@overload
def with_delayed_retry(
    **options: Unpack[HandlerOptions],
) -> Callable[[Callable[P, Awaitable[object]]], RetryingHandler[P]]: ...


def with_delayed_retry(
    fn: Callable[P, Awaitable[object]] | None = None,
    /,
    **options: Unpack[HandlerOptions],
) -> RetryingHandler[P] | Callable[[Callable[P, Awaitable[object]]], RetryingHandler[P]]:
    """Wrap an aio-pika consumer handler with delayed retries and parking.

    Use it on any handler that may fail for reasons that pass: it acks on
    success, and on failure sends the message through the delay chain to
    come back to ``queue`` after the backoff, or to the parking queue once
    retries are spent. Works with and without parentheses.

    The options are keyword-only and checked when decorating: those of
    :class:`~delayed_retry.consumer.options.HandlerOptions`, each with its type,
    default and meaning (the Retries guide shows them as a table). An unknown
    name is a ``TypeError``, a bad value a :class:`~delayed_retry.ConfigurationError`.
    """
    settings = retry_options(options, accepted=HandlerOptions, caller="with_delayed_retry()")

    def decorate(func: Callable[P, Awaitable[object]]) -> RetryingHandler[P]:
        if not (
            inspect.iscoroutinefunction(func)
            or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004
        ):
            raise ConfigurationError(
                f"@with_delayed_retry needs an async function (async def), got {func!r}; "
                "aio-pika awaits the consumer callback"
            )
        return RetryingHandler(func, settings)

    return decorate(fn) if fn is not None else decorate


def retry_options(
    given: Mapping[str, object], *, accepted: type[SubscriberOptions], caller: str
) -> RetryOptions:
    """Check the options a front end was ``given`` and build its :class:`RetryOptions`.

    Every front end that retries a consumer's failures (the decorator with
    :class:`HandlerOptions`, the FastStream middleware with
    :class:`SubscriberOptions`) checks its options here, once when it is
    configured, so a bad option fails the same way, with the same message;
    ``caller`` names the front end in the error for an unknown option.
    """
    o = with_defaults(accepted, given, caller=caller)
    queue: str | None = o.get("queue")
    topology = o["topology"]
    return_to = o["return_to"]
    parking_queue = o["parking_queue"]
    instrumentation = o["instrumentation"]
    hold = o["hold"]
    throttle, crash_guard = o["throttle"], o["crash_guard"]
    if return_to not in ("queue", "exchange"):
        raise ConfigurationError(
            f"return_to={return_to!r} must be 'queue' (the failing queue) or 'exchange' "
            "(the exchange and routing key the message was delivered with)"
        )
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
    check_hold(hold, topology)
    if throttle is not None and not isinstance(throttle, Throttle):
        raise ConfigurationError(
            f"throttle={throttle!r} must be a delayed_retry.Throttle, e.g. "
            "Throttle(consecutive=5, probe_every=1.0), or None"
        )
    if crash_guard is not None and not isinstance(crash_guard, CrashGuard):
        raise ConfigurationError(
            f"crash_guard={crash_guard!r} must be a delayed_retry.CrashGuard, e.g. "
            "CrashGuard(max_crashes=3), or None"
        )
    immediate = ImmediateRetries(times=o["immediate_retries"], wait=o["immediate_wait"])
    hooks = FailureHooks(on_retry=o["on_retry"], on_park=o["on_park"])
    policy_kwargs: dict[str, Any] = {
        "max_retries": o["max_retries"],
        "wait": o["wait"],
        "stop": o["stop"],
    }
    if o["retry"] is not None:
        policy_kwargs["retry"] = o["retry"]
    return RetryOptions(
        queue=queue,
        policy=RetryPolicy(**policy_kwargs),
        topology=topology,
        parking_queue=parking_queue,
        publish_timeout=to_seconds(o["publish_timeout"], name="publish_timeout")
        or DEFAULT_PUBLISH_TIMEOUT,
        instrumentation=instrumentation or default_instrumentation(),
        return_to=return_to,
        hold=hold,
        immediate=immediate if immediate.times else None,
        hooks=hooks if hooks.any else None,
        throttle=throttle,
        crash_guard=crash_guard,
    )


async def consume(
    queue: AbstractQueue,
    handler: RetryingHandler[[AbstractIncomingMessage]],
    **consume_kwargs: Any,
) -> str:
    """Consume ``queue`` with ``handler``, telling it the queue so retries come back here.

    Declares the topology, the queue's binding and its parking queue first,
    so a misconfiguration fails here and not at the first failure (and the
    dead-letter queue a queue declared with
    :func:`~delayed_retry.work_queues.work_queue_arguments` names), and warns
    when the queue's delivery limit (as declared through ``queue``) could drop
    messages before they are parked (:mod:`delayed_retry.delivery_limits`). Refuses a
    queue whose consumer aio-pika's robust channel would not restore after a
    reconnect (taken with ``get_queue(..., ensure=False)``): take it with
    ``channel.declare_queue(name, passive=True)``. Returns the consumer tag.
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
    if consume_kwargs.get("no_ack"):
        raise ConfigurationError(
            f"consume({queue.name!r}, {handler!r}, no_ack=True) is refused: the broker forgets a "
            "no-ack message on delivery, so a failure could not be retried or parked without "
            "losing it; drop no_ack=True"
        )
    check_restorable(queue)
    bound = handler.for_queue(queue.name)
    # A queue declared with work_queue_arguments: its dead-letter queue is declared with it.
    target = dead_letter_target(getattr(queue, "arguments", None))
    if target is not None:
        bound = RetryingHandler(bound.fn, replace(bound.options, dead_letter_queue=target))
    underlay = await underlay_channel(queue.channel)
    if not getattr(underlay, "publisher_confirms", False):
        # Every hand-over would fail on its first failure and leave the message unacked.
        raise ConfigurationError(
            f"queue {queue.name!r} is consumed on a channel without publisher confirms, so "
            f"{handler!r} could never know a retry was handed over; open the channel with "
            "connection.channel(publisher_confirms=True), aio-pika's default"
        )
    await bound.declare(queue.channel)
    warn_about_delivery_limit(
        queue=queue.name,
        arguments=getattr(queue, "arguments", None),
        max_retries=handler.options.policy.max_retries,
        server_properties=getattr(underlay.connection, "server_properties", None),
    )
    return (await start_consumer(queue, bound, **consume_kwargs)).tag
