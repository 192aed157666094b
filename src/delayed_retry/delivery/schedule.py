"""Schedule any message for later through the delay chain."""

from __future__ import annotations

from datetime import datetime
from types import EllipsisType
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel

from delayed_retry.amqp.chain import publish_into_chain
from delayed_retry.amqp.declarer import EXISTS_CACHE_SECONDS, declarer_for
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import Duration, resolve_due_at, to_epoch_ms, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.names import (
    X_FORWARD_ROUTING_KEY,
    X_ORIGINAL_EXCHANGE,
    X_ORIGINAL_ROUTING_KEY,
)
from delayed_retry.headers.retry_state import scheduled_headers
from delayed_retry.observability.instrumentation import Instrumentation, NoInstrumentation
from delayed_retry.observability.otel import default_instrumentation
from delayed_retry.recovery.hold import DEFAULT_HOLD, Hold, chain_units, check_hold

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

    Returns the due time. Give exactly one of ``queue`` and ``exchange``.

    Use it to do something later without a scheduler: a reminder three days
    after delivery, a timeout check in ten minutes. ``delay`` is seconds, a
    ``timedelta``, or an aware ``datetime`` (a due time in the past delivers
    at once). The message waits inside RabbitMQ and is never delivered before
    its due time. It returns once the broker has confirmed the publish.

    Raises :class:`~delayed_retry.errors.DelayOutOfRangeError` for a negative,
    NaN or too long delay, and :class:`~delayed_retry.errors.ConfigurationError`
    when ``queue`` or ``exchange`` does not exist.

    With ``exchange``, every queue bound to it for ``routing_key`` receives
    the message at its due time, as if it were published then (the
    delayed-message plugin's semantics). It waits in the chain and then in
    the exchange's forward queue, from which a
    :class:`~delayed_retry.delivery.forwarder.Forwarder` (``delayed-retry forwarder``,
    or the front door) publishes it: run one. Should ``exchange`` be deleted
    while the message waits, the forwarder parks it with a record.

    ``hold`` (a :class:`~delayed_retry.recovery.hold.Hold`, e.g. ``DEFAULT_HOLD``) lets
    the message leave the chain before its due time (up to the hold's limit)
    for a consumer that holds it until due: about a millisecond late instead
    of a few per hop, and a fraction of the hops (see :mod:`delayed_retry.recovery.hold`).
    With ``exchange`` it is ``DEFAULT_HOLD`` unless given: a
    :class:`~delayed_retry.delivery.forwarder.Forwarder` always consumes
    those, and never forwards a message before it is due. With ``queue`` it
    is ``None`` unless given: pass ``hold=DEFAULT_HOLD`` when a
    ``@with_delayed_retry`` handler consumes ``queue``, and only then; any
    other consumer would get the message early.
    """
    if not isinstance(message, aio_pika.Message):
        raise ConfigurationError(f"message={message!r} must be an aio_pika.Message")
    if (queue is None) == (exchange is None):
        raise ConfigurationError(
            f"publish_delayed needs exactly one destination: queue={queue!r} or "
            f"exchange={exchange!r} (with routing_key)"
        )
    if exchange is not None and not isinstance(routing_key, str):
        raise ConfigurationError(f"routing_key={routing_key!r} must be a str")
    if isinstance(hold, EllipsisType):
        hold = DEFAULT_HOLD if exchange is not None else None
    check_hold(hold, topology)
    start = now or utcnow()
    due_at = resolve_due_at(delay, now=start)
    # Before any I/O: a delay out of the chain's range raises here, having sent nothing.
    units = chain_units(topology, due_at, now=start, hold=hold)
    underlay = await channel.get_underlay_channel()
    headers: dict[str, Any] = scheduled_headers(message.headers, due_at=due_at)
    if exchange is not None:
        declarer = declarer_for(underlay.connection)
        await declarer.exchange_exists(underlay.connection, exchange, cache=EXISTS_CACHE_SECONDS)
        target = await declarer.forward_queue(underlay.connection, topology, exchange)
        headers[X_FORWARD_ROUTING_KEY] = routing_key
        headers.setdefault(X_ORIGINAL_EXCHANGE, exchange)
        headers.setdefault(X_ORIGINAL_ROUTING_KEY, routing_key)
    else:
        assert queue is not None
        target = queue
        await declarer_for(underlay.connection).destination(
            underlay.connection, topology, queue, with_parking=False
        )
        # It arrives from a level exchange with a chain routing key; should it fail, its
        # record names the queue itself (default exchange, key = queue) as where it came from.
        headers.setdefault(X_ORIGINAL_EXCHANGE, "")
        headers.setdefault(X_ORIGINAL_ROUTING_KEY, queue)
    route = topology.route(units, target)
    inst = instrumentation or default_instrumentation()
    # Like the handler's success path: no span or metric work while nothing records them.
    enabled = getattr(inst, "enabled", None)
    observed = inst.scheduling if enabled is None or enabled() else _QUIET.scheduling
    with observed(
        headers,
        queue=target,
        exchange=route.exchange,
        routing_key=route.routing_key,
        delay=(to_epoch_ms(due_at) - to_epoch_ms(start)) / 1000,
    ):
        await publish_into_chain(
            underlay,
            message,
            topology=topology,
            route=route,
            headers=headers,
            timeout=publish_timeout,
        )
    return due_at
