"""``@with_delayed_retry``: retries for aio-pika consumers, through the delay chain.

The decorator and the handler it makes: read the retry state, run the
handler, ack on success, and on failure let :mod:`delayed_retry.handover`
carry out the policy's decision (publish the copy with confirms, then ack).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Generic, ParamSpec, overload

import aiormq
import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from delayed_retry.checks import warn_about_delivery_limit
from delayed_retry.declare import declarer_for, underlay_of
from delayed_retry.durations import Duration, to_seconds, utcnow
from delayed_retry.errors import (
    ConfigurationError,
)
from delayed_retry.handover import HandOver
from delayed_retry.headers import (
    RetryState,
    parse_retry_state,
)
from delayed_retry.observability.instrumentation import Instrumentation
from delayed_retry.observability.otel import default_instrumentation
from delayed_retry.policy import DEFAULT_WAIT, RetryPolicy
from delayed_retry.publishing import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.topology import DEFAULT_TOPOLOGY, DelayTopology

__all__ = [
    "RetryingHandler",
    "consume",
    "current_retry_state",
    "retry_state",
    "with_delayed_retry",
    "EARLY_TOLERANCE",
]

log = logging.getLogger(__name__)

P = ParamSpec("P")

_current_state: contextvars.ContextVar[RetryState | None] = contextvars.ContextVar(
    "delayed_retry_state", default=None
)

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

    def _hand_over(self, queue: str) -> HandOver:
        opts = self.options
        return HandOver(
            queue=queue,
            topology=opts.topology,
            parking_queue=opts.parking_queue,
            publish_timeout=opts.publish_timeout,
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
            and opts.topology.is_chain_exchange(message.exchange)
            and state.due_at - now > EARLY_TOLERANCE
            and state.due_at - now <= opts.topology.max_delay
        ):
            await self._hand_over(queue).redelay(message, state.due_at)
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
                await self._hand_over(queue).failed(message, state, exc, decision, scope)
                return
            finally:
                _current_state.reset(token)
            if not message.processed:
                await message.ack()
            scope.finish("success")


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
        if not (
            inspect.iscoroutinefunction(func)
            or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004
        ):
            raise ConfigurationError(
                f"@with_delayed_retry needs an async function (async def), got {func!r}; "
                "aio-pika awaits the consumer callback"
            )
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
    warn_about_delivery_limit(
        queue=queue.name,
        arguments=getattr(queue, "arguments", None),
        max_retries=handler.options.policy.max_retries,
        server_properties=getattr(underlay.connection, "server_properties", None),
    )
    return await queue.consume(bound, **consume_kwargs)
