"""Schedule any message for later through the delay chain."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from types import EllipsisType
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel

from delayed_retry.amqp.chain import ToExchange, ToQueue, send_into_chain
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import Duration, resolve_due_at, to_epoch_ms, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.names import X_ORIGINAL_EXCHANGE, X_ORIGINAL_ROUTING_KEY
from delayed_retry.headers.retry_state import scheduled_headers
from delayed_retry.observability.instrumentation import Instrumentation, NoInstrumentation
from delayed_retry.observability.otel import default_instrumentation
from delayed_retry.recovery.hold import DEFAULT_HOLD, Hold, check_hold

__all__ = ["publish_delayed"]


_QUIET = NoInstrumentation()


async def publish_delayed(
    channel: AbstractChannel,
    message: aio_pika.Message,
    *,
    queue: str | None = None,
    exchange: str | None = None,
    routing_key: str = "",
    delay: Duration | datetime,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
    instrumentation: Instrumentation | None = None,
    hold: Hold | EllipsisType | None = ...,
    now: datetime | None = None,
) -> datetime:
    """Deliver ``message`` to ``queue``, or to ``exchange`` with ``routing_key``, after ``delay``.

    Use it to do something later without a scheduler: a reminder in three
    days, a timeout check in ten minutes. ``delay`` is seconds, a ``timedelta``
    or an aware ``datetime``; the message waits inside RabbitMQ, is never
    delivered early, and this returns its due time once the broker confirmed
    it. Give exactly one of ``queue`` and ``exchange``; an exchange needs a
    running :class:`~delayed_retry.delivery.forwarder.Forwarder`. ``hold``
    (default: ``DEFAULT_HOLD`` for an exchange, ``None`` for a queue) is for a
    consumer that holds early messages until due; see ``docs/scheduling.md``.

    Raises :class:`~delayed_retry.errors.DelayOutOfRangeError` for a negative,
    NaN or too long delay, and :class:`~delayed_retry.errors.ConfigurationError`
    when ``queue`` or ``exchange`` does not exist.
    """
    to = _destination(message, queue, exchange, routing_key)
    if isinstance(hold, EllipsisType):
        hold = DEFAULT_HOLD if exchange is not None else None
    check_hold(hold, topology)
    start = now or utcnow()
    due_at = resolve_due_at(delay, now=start)
    underlay = await channel.get_underlay_channel()
    await send_into_chain(
        underlay,
        message,
        topology=topology,
        to=to,
        due_at=due_at,
        now=start,
        hold=hold,
        headers=_scheduled_headers(message, queue, exchange, routing_key, due_at),
        observe=functools.partial(
            _observer(instrumentation),
            queue=queue if queue is not None else topology.forward_queue(exchange or ""),
            delay=(to_epoch_ms(due_at) - to_epoch_ms(start)) / 1000,
        ),
        timeout=publish_timeout,
    )
    return due_at


def _destination(
    message: aio_pika.Message, queue: str | None, exchange: str | None, routing_key: str
) -> ToQueue | ToExchange:
    """Where the message goes: a queue (no parking: nobody consumes it through the library),
    or an exchange that must exist; refuses arguments that name neither, or both."""
    if not isinstance(message, aio_pika.Message):
        raise ConfigurationError(f"message={message!r} must be an aio_pika.Message")
    if (queue is None) == (exchange is None):
        raise ConfigurationError(
            f"publish_delayed needs exactly one destination: queue={queue!r} or "
            f"exchange={exchange!r} (with routing_key)"
        )
    if exchange is not None:
        if not isinstance(routing_key, str):
            raise ConfigurationError(f"routing_key={routing_key!r} must be a str")
        return ToExchange(exchange, routing_key, check_exists=True)
    assert queue is not None
    return ToQueue(queue, with_parking=False)


def _scheduled_headers(
    message: aio_pika.Message,
    queue: str | None,
    exchange: str | None,
    routing_key: str,
    due_at: datetime,
) -> dict[str, Any]:
    """The scheduled copy's headers: its due time, and where it was sent, for its record."""
    headers: dict[str, Any] = scheduled_headers(message.headers, due_at=due_at)
    if exchange is not None:
        headers.setdefault(X_ORIGINAL_EXCHANGE, exchange)
        headers.setdefault(X_ORIGINAL_ROUTING_KEY, routing_key)
    else:
        # It arrives from a level exchange with a chain routing key; should it fail, its
        # record names the queue itself (default exchange, key = queue) as where it came from.
        headers.setdefault(X_ORIGINAL_EXCHANGE, "")
        headers.setdefault(X_ORIGINAL_ROUTING_KEY, queue)
    return headers


def _observer(
    instrumentation: Instrumentation | None,
) -> Callable[..., AbstractContextManager[None]]:
    """The instrumentation's ``scheduling``; a quiet one while nothing records spans or metrics."""
    inst = instrumentation or default_instrumentation()
    enabled = getattr(inst, "enabled", None)
    return inst.scheduling if enabled is None or enabled() else _QUIET.scheduling
