"""Remove a delay chain's queues and exchanges, only when nothing waits in them.

For a chain no longer used (after ``topology migrate`` moved its messages, or
a test chain). Queues are deleted with ``if-empty``, so the broker itself
refuses a queue that received a message since it was checked; exchanges go
after every queue is gone (deleting them removes the consumers' bindings to
the chain). Nothing is deleted when any queue holds messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import aiormq
from aio_pika.abc import AbstractConnection

from delayed_retry.admin.chain_probe import queue_depth
from delayed_retry.topology import DelayTopology

__all__ = ["TeardownPlan", "plan_teardown", "tear_down"]


@dataclass
class TeardownPlan:
    """What a teardown would delete, and what stops it."""

    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)
    not_empty: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def blocked(self) -> bool:
        return bool(self.not_empty)


async def _exchange_exists(connection: AbstractConnection, name: str) -> bool:
    channel = await connection.channel(publisher_confirms=False)
    try:
        await channel.declare_exchange(name, passive=True)
        return True
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    finally:
        if not channel.is_closed:
            await channel.close()


async def plan_teardown(
    connection: AbstractConnection, topology: DelayTopology, *, queues: Iterable[str] = ()
) -> TeardownPlan:
    """Look at every queue and exchange of ``topology`` (and ``queues``' parking queues)."""
    plan = TeardownPlan()
    names = [spec.name for spec in topology.queues()]
    names += [topology.default_parking_queue(q) for q in queues]
    for name in names:
        depth = await queue_depth(connection, name)
        if depth is None:
            plan.missing.append(name)
        elif depth:
            plan.not_empty[name] = depth
        else:
            plan.queues.append(name)
    for spec in topology.exchanges():
        if await _exchange_exists(connection, spec.name):
            plan.exchanges.append(spec.name)
        else:
            plan.missing.append(spec.name)
    return plan


async def tear_down(connection: AbstractConnection, plan: TeardownPlan) -> list[str]:
    """Delete what ``plan`` lists; returns the queues the broker refused as not empty.

    When a queue is refused, no exchange is deleted: the chain keeps working
    for whatever still waits in it.
    """
    refused = []
    for name in plan.queues:
        channel = await connection.channel(publisher_confirms=False)
        try:
            await channel.queue_delete(name, if_empty=True)
        except aiormq.exceptions.ChannelPreconditionFailed:
            refused.append(name)
        except aiormq.exceptions.ChannelNotFoundEntity:
            pass
        finally:
            if not channel.is_closed:
                await channel.close()
    if refused:
        return refused
    for name in plan.exchanges:
        channel = await connection.channel(publisher_confirms=False)
        try:
            await channel.exchange_delete(name)
        except aiormq.exceptions.ChannelNotFoundEntity:
            pass
        finally:
            if not channel.is_closed:
                await channel.close()
    return []
