"""The chain's queue leaders as ``status`` shows them: read through the management API.

AMQP cannot say where a queue's leader runs; the management API lists it.
A command that cannot reach the API shows no leaders and says why.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from delayed_retry.admin.live_chain import LiveQueue
from delayed_retry.admin.management import BEST_EFFORT_TIMEOUT, ManagementError
from delayed_retry.chain.leaders import LeaderSpread, leader_spread, lopsided_warning
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli import common
from delayed_retry.rabbitmq.urls import vhost_of

__all__ = ["ChainLeaders", "read_chain_leaders"]


@dataclass(frozen=True, kw_only=True)
class ChainLeaders:
    """Where the chain's level queues lead and replicate, or why that is not known."""

    spread: LeaderSpread | None
    members: dict[str, tuple[str, ...]]
    """Level queue name → the nodes holding a replica."""
    warning: str | None = None
    """Set when one node leads more than its share of the levels."""
    unread: str | None = None
    """Why the leaders could not be read (``spread`` is then ``None``)."""


async def read_chain_leaders(args: argparse.Namespace, topology: DelayTopology) -> ChainLeaders:
    """Read the leader and members of each level queue; never fails for want of the API."""
    try:
        queues = await common.management_client(args, timeout=BEST_EFFORT_TIMEOUT).queues()
    except ManagementError as exc:
        return ChainLeaders(spread=None, members={}, unread=str(exc))
    by_name: dict[str, LiveQueue] = {queue.name: queue for queue in queues}
    levels = [topology.level_name(level) for level in range(topology.levels)]
    spread = leader_spread(
        topology, {name: by_name[name].leader for name in levels if name in by_name}
    )
    members = {name: by_name[name].members for name in levels if name in by_name}
    nodes = {node for replicas in members.values() for node in replicas}
    warning = lopsided_warning(topology, spread, nodes=nodes, vhost=vhost_of(args.url))
    return ChainLeaders(spread=spread, members=members, warning=warning)
