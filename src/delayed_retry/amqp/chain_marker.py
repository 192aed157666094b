"""The chain's markers on a broker: whether a new connection may skip declaring the chain.

A declaration of the chain deletes the settled marker first and writes both markers
(:mod:`delayed_retry.chain.digest` names them) once every binding is confirmed;
:func:`chain_is_marked_complete` asks whether every exchange and queue of the chain and both
markers exist. What the markers vouch for and what they cannot see (a binding removed by
hand): docs/operating-the-chain.md, "What a new connection checks before declaring the
chain".
"""

from __future__ import annotations

import logging

import aiormq
import aiormq.abc

from delayed_retry.amqp.channels import on_scratch_channel
from delayed_retry.chain.digest import markers
from delayed_retry.chain.topology import DelayTopology

__all__ = ["chain_is_marked_complete", "withdraw_markers", "write_markers"]

log = logging.getLogger(__name__)


async def chain_is_marked_complete(
    connection: aiormq.abc.AbstractConnection, topology: DelayTopology
) -> bool:
    """Whether every exchange and queue of ``topology`` exists, and both its markers too.

    Passive declarations, each answered before the next is sent, the settled
    marker last. Not pipelined: a missing object makes the broker close the
    channel, and a frame the client sends on it after answering that close is
    a connection error that would close every channel of the connection.
    Any refusal answers ``False`` (the declaration that follows explains it).
    On a scratch channel of its own.
    """
    digest, settled = markers(topology)

    async def check(channel: aiormq.abc.AbstractChannel) -> None:
        for exchange in topology.exchanges():
            await channel.exchange_declare(exchange.name, passive=True)
        for spec in topology.queues():
            await channel.queue_declare(spec.name, passive=True)
        await channel.exchange_declare(digest, passive=True)
        # Last: a declaration under way deleted it before making anything.
        await channel.exchange_declare(settled, passive=True)

    try:
        await on_scratch_channel(connection, check)
    except (aiormq.exceptions.ChannelClosed, aiormq.exceptions.ChannelInvalidStateError) as exc:
        log.debug("declaring the delay chain %r in full: %s", topology.prefix, exc)
        return False
    return True


async def withdraw_markers(channel: aiormq.abc.AbstractChannel, topology: DelayTopology) -> None:
    """Delete ``topology``'s markers before declaring: a declaration cut short leaves neither.

    The settled marker is every version's and every setting's: while it is
    gone, every connection declares the chain in full. Without waiting for the
    answers: the declarations that follow on ``channel`` come after them, and
    deleting an exchange that does not exist is no error.
    """
    for name in markers(topology):
        await channel.exchange_delete(name, nowait=True)


async def write_markers(channel: aiormq.abc.AbstractChannel, topology: DelayTopology) -> None:
    """Write ``topology``'s markers, the settled one last: only once every binding is confirmed.

    Internal fanout exchanges with no bindings: nothing can be published to
    them, and they route nothing.
    """
    described = (
        f"every exchange, queue and binding of the delay chain {topology.prefix!r} was "
        "declared; a connection that finds this declares none of its bindings"
    )
    for name in markers(topology):
        await channel.exchange_declare(
            name,
            exchange_type="fanout",
            durable=True,
            internal=True,
            arguments={"x-delayed-retry-marker": described},
        )
