"""Send a message into the delay chain: the one call every sender makes.

Decide, then send: whoever moves a message on (a retry, a redelay of an
early message, the front door, the forwarder, ``publish_delayed``,
FastStream's put-back) decides its due time and destination and calls
:func:`send_into_chain`; :func:`keep_unroutable` is the same publish to the
chain's unroutable exchange. No other module publishes into the chain.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import aiormq
import aiormq.abc

from delayed_retry.amqp.declarer import EXISTS_CACHE_SECONDS, declarer_for
from delayed_retry.amqp.publish import (
    DEFAULT_PUBLISH_TIMEOUT,
    Copyable,
    Publisher,
    publish_confirmed,
    publish_copy,
)
from delayed_retry.chain.topology import DelayTopology, Route
from delayed_retry.durations import utcnow
from delayed_retry.errors import PublishError
from delayed_retry.headers.names import X_FORWARD_ROUTING_KEY
from delayed_retry.recovery.hold import Hold, chain_units, redelay_units

__all__ = ["Observe", "ToExchange", "ToQueue", "keep_unroutable", "send_into_chain"]


class ToQueue(NamedTuple):
    """A queue at the chain's end: its binding (and parking queue) declared before the send.

    ``declare=False`` for a queue the message just came out of the chain to:
    its binding exists. ``with_parking=False`` when nobody consumes it through
    the library (a scheduled message), so it gets no parking queue.
    """

    name: str
    parking_queue: str | None = None
    with_parking: bool = True
    declare: bool = True


class ToExchange(NamedTuple):
    """An exchange and routing key: the message waits in the exchange's forward queue.

    A forwarder publishes it to ``name`` with ``routing_key`` once due.
    ``check_exists`` refuses an exchange that does not exist (a producer's
    mistake); a retry returning to the exchange it came from skips the check.
    """

    name: str
    routing_key: str
    check_exists: bool = False


class Observe(Protocol):
    """What wraps the publish for tracing, given the route: an attempt scope's ``publishing``."""

    def __call__(
        self, headers: dict[str, Any], *, exchange: str, routing_key: str
    ) -> AbstractContextManager[None]: ...


async def send_into_chain(
    channel: aiormq.abc.AbstractChannel,
    message: Copyable,
    *,
    topology: DelayTopology,
    to: ToQueue | ToExchange,
    due_at: datetime,
    headers: dict[str, Any],
    now: datetime | None = None,
    hold: Hold | None = None,
    early: bool = False,
    straight_when_due: bool = False,
    observe: Observe | None = None,
    timeout: float = DEFAULT_PUBLISH_TIMEOUT,
    keep_delivery_mode: bool = False,
    publish: Publisher = publish_confirmed,
) -> Route:
    """Publish a copy of ``message`` that reaches ``to`` at ``due_at``; return its route.

    Turns the due time into a route, declares what ``to`` needs (cached),
    publishes with confirms; after a missing-exchange refusal the next call
    declares the chain again. ``hold``: the message may leave early
    for a consumer that holds it until due; ``early``: it came out before
    ``due_at`` and must wait in the chain; ``straight_when_due``: a message due
    already goes to its queue through the default exchange. ``headers`` gets
    the forward routing key and ``observe``'s trace context. Raises
    ``DelayOutOfRangeError`` before any I/O, ``PublishError`` when not confirmed.
    """
    now = now or utcnow()
    queue = to.name if isinstance(to, ToQueue) else topology.forward_queue(to.name)
    units = (redelay_units if early else chain_units)(topology, due_at, now=now, hold=hold)
    route = topology.route(units, queue)
    connection = channel.connection
    if isinstance(to, ToExchange):
        await _declare_forwarding(connection, topology, to)
        headers[X_FORWARD_ROUTING_KEY] = to.routing_key
    elif to.declare:  # cached per connection: every retry asks
        await declarer_for(connection).destination(
            connection, topology, to.name, to.parking_queue, with_parking=to.with_parking
        )
    if straight_when_due and isinstance(to, ToQueue) and due_at <= now:
        route = Route("", queue, 0)
    observed = _QUIET if observe is None else observe
    with observed(headers, exchange=route.exchange, routing_key=route.routing_key):
        if route.exchange:
            await _publish(
                channel, message, topology, route, headers, timeout, keep_delivery_mode, publish
            )
        else:  # the default exchange: nothing of the chain to declare or heal
            await publish_copy(
                channel,
                message,
                exchange="",
                routing_key=route.routing_key,
                headers=headers,
                timeout=timeout,
                publish=publish,
            )
    return route


async def keep_unroutable(
    channel: aiormq.abc.AbstractChannel,
    message: Copyable,
    *,
    topology: DelayTopology,
    routing_key: str,
    headers: dict[str, Any],
    timeout: float = DEFAULT_PUBLISH_TIMEOUT,
) -> None:
    """Publish a copy of ``message`` to the chain's unroutable exchange, declared and healed.

    For a message that must not be routed anywhere (the router's unknown
    queue): it is kept in ``<prefix>.unroutable`` with its record.
    """
    route = Route(topology.unroutable_exchange, routing_key, 0)
    await _publish(channel, message, topology, route, headers, timeout, False, publish_confirmed)


async def _declare_forwarding(
    connection: aiormq.abc.AbstractConnection, topology: DelayTopology, to: ToExchange
) -> None:
    """Check that ``to``'s exchange exists if asked, and declare its forward queue (cached)."""
    declarer = declarer_for(connection)
    if to.check_exists:
        await declarer.exchange_exists(connection, to.name, cache=EXISTS_CACHE_SECONDS)
    await declarer.forward_queue(connection, topology, to.name)


async def _publish(
    channel: aiormq.abc.AbstractChannel,
    message: Copyable,
    topology: DelayTopology,
    route: Route,
    headers: dict[str, Any],
    timeout: float,
    keep_delivery_mode: bool,
    publish: Publisher,
) -> None:
    """The low-level chain publish: topology declared, copy confirmed, a lost exchange forgotten."""
    connection = channel.connection
    declarer = declarer_for(connection)
    await declarer.topology(connection, topology)
    try:
        await publish_copy(
            channel,
            message,
            exchange=route.exchange,
            routing_key=route.routing_key,
            headers=headers,
            timeout=timeout,
            keep_delivery_mode=keep_delivery_mode,
            publish=publish,
        )
    except PublishError as err:
        if isinstance(err.__cause__, aiormq.exceptions.ChannelNotFoundEntity):
            declarer.forget(topology)
        raise


def _quiet(
    headers: dict[str, Any], *, exchange: str, routing_key: str
) -> AbstractContextManager[None]:
    return _NOTHING


_NOTHING: AbstractContextManager[None] = nullcontext()
_QUIET: Observe = _quiet
