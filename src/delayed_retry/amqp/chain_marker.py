"""The chain's marker on a broker: whether a new connection may skip declaring the chain.

A declaration of the chain removes the marker first and writes it last, once
the broker has confirmed every binding (:mod:`delayed_retry.chain_digest`
names it after a digest of those declarations). A connection then asks, in
one round trip, :func:`chain_is_marked_complete`: every exchange and queue of
the chain exists, and so does the marker of exactly these declarations.

What that vouches for: nothing of the chain was deleted since (a deleted
exchange or queue takes its bindings with it, and is missing until a
declaration makes it again, which removes the marker first); the settings
and this version's declarations are those that completed (another digest is
another marker). What it cannot see: one binding removed by hand (AMQP
cannot read bindings), an object deleted and made again by hand or by another
tool without its bindings, and the arguments of what exists (compared by the
declaration that wrote the marker; the broker changes no queue's arguments
without deleting it). ``delayed-retry topology verify`` sees those through the
management API, and ``delayed-retry declare`` puts them right.
"""

from __future__ import annotations

import logging

import aiormq
import aiormq.abc

from delayed_retry.amqp.channels import on_scratch_channel
from delayed_retry.chain_digest import marker_exchange
from delayed_retry.topology import DelayTopology

__all__ = ["chain_is_marked_complete", "withdraw_marker", "write_marker"]

log = logging.getLogger(__name__)


async def chain_is_marked_complete(
    connection: aiormq.abc.AbstractConnection, topology: DelayTopology
) -> bool:
    """Whether every exchange and queue of ``topology`` exists, and its marker too.

    Passive declarations without waiting for each answer, then one that waits,
    for the marker: the broker handles a channel's requests in order, so its
    answer comes after all of them, and a missing one has closed the channel
    by then. Any refusal answers ``False`` (the declaration that follows
    explains it). On a scratch channel of its own.
    """
    marker = marker_exchange(topology)

    async def check(channel: aiormq.abc.AbstractChannel) -> None:
        for exchange in topology.exchanges():
            await channel.exchange_declare(exchange.name, passive=True, nowait=True)
        for spec in topology.queues():
            await channel.queue_declare(spec.name, passive=True, nowait=True)
        # Last: a declaration in progress elsewhere removed it before making anything.
        await channel.exchange_declare(marker, passive=True)

    try:
        await on_scratch_channel(connection, check)
    except (aiormq.exceptions.ChannelClosed, aiormq.exceptions.ChannelInvalidStateError) as exc:
        log.debug("declaring the delay chain %r in full: %s", topology.prefix, exc)
        return False
    return True


async def withdraw_marker(channel: aiormq.abc.AbstractChannel, topology: DelayTopology) -> None:
    """Remove ``topology``'s marker before declaring: a declaration cut short leaves none.

    Without waiting for the answer: the declarations that follow on ``channel``
    come after it, and deleting an exchange that does not exist is no error.
    """
    await channel.exchange_delete(marker_exchange(topology), nowait=True)


async def write_marker(channel: aiormq.abc.AbstractChannel, topology: DelayTopology) -> None:
    """Write ``topology``'s marker: call it only once every binding has been confirmed.

    An internal fanout exchange with no bindings: nothing can be published to
    it, and it routes nothing.
    """
    await channel.exchange_declare(
        marker_exchange(topology),
        exchange_type="fanout",
        durable=True,
        internal=True,
        arguments={
            "x-delayed-retry-marker": (
                f"every exchange, queue and binding of the delay chain {topology.prefix!r} "
                "was declared; a connection that finds this declares none of its bindings"
            )
        },
    )
