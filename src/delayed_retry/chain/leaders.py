"""Where a chain's queue leaders live in a cluster, and the commands that spread them. Pure.

A quorum queue's leader lands where the declaring client is connected
(``client-local``), so a chain declared over one connection leads every level
from one node. Queue arguments take part in the broker's equivalence check,
so the library cannot ask for another placement in its declarations without
breaking every older version that declares the same queues; a policy can:
:func:`leader_policies` places the queues declared after it, and
:func:`rebalance_args` moves the leaders of a chain declared before it.
:func:`leader_spread` reads where they are; :func:`lopsided_warning` says
when one node leads too much of the chain. docs/operating-the-chain.md has the
decision and the commands; docs/capacity.md what the spread is worth.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.rabbitmq.policies import BrokerPolicy, regex_literal

__all__ = [
    "LeaderSpread",
    "leader_policies",
    "leader_spread",
    "lopsided_warning",
    "rebalance_args",
    "rebalance_command",
    "spread_bound",
]

LEADER_POLICY_PRIORITY = 1
"""Above the broker's default 0, so a catch-all ``.*`` policy does not displace it."""


def _chain_pattern(topology: DelayTopology) -> str:
    """A regular expression matching the names of every queue the chain owns.

    Parking queues (``Q.parking``) are named after the user's queues and are
    left out: an ordinary policy on them would displace the user's own.
    """
    if topology.naming == "nservicebus-v2":
        return f"^{regex_literal(topology.level_name(0)[:-2])}[0-9]+$"
    return f"^{regex_literal(topology.prefix)}\\."


def leader_policies(topology: DelayTopology, *, broker_major: int | None) -> list[BrokerPolicy]:
    """The policies that place the leaders of the chain's queues declared after them.

    Set them once per vhost, before the chain is declared (or before
    :func:`rebalance_args` for a chain declared before). On RabbitMQ 4.x
    ``balanced`` places a new quorum or classic queue's leader on the node that
    leads fewest queues. On 3.x, quorum queues take ``least-leaders``, and a
    policy that also names ``queue-master-locator`` does not apply to them
    at all, so the chain's one classic queue (the alert queue) gets a policy
    of its own, one priority higher, with ``min-masters``. These are ordinary
    policies: one displaces another on the same queue, so a user's policy on
    the chain's queues needs these keys added to it instead.
    """
    pattern = _chain_pattern(topology)
    name = f"{topology.prefix}.leaders" if topology.naming == "delayed-retry" else "nsb.v2.leaders"
    if broker_major is not None and broker_major >= 4:
        return [
            BrokerPolicy(
                name=name,
                pattern=pattern,
                definition={"queue-leader-locator": "balanced"},
                priority=LEADER_POLICY_PRIORITY,
            )
        ]
    policies = [
        BrokerPolicy(
            name=name,
            pattern=pattern,
            definition={"queue-leader-locator": "least-leaders"},
            priority=LEADER_POLICY_PRIORITY,
        )
    ]
    if topology.naming == "delayed-retry":
        policies.append(
            BrokerPolicy(
                name=f"{name}.alerts",
                pattern=f"^{regex_literal(topology.alerts_queue)}$",
                definition={"queue-master-locator": "min-masters"},
                priority=LEADER_POLICY_PRIORITY + 1,
            )
        )
    return policies


def rebalance_args(topology: DelayTopology, *, vhost: str = "/") -> list[str]:
    """Arguments of ``rabbitmq-queues`` that spread the leaders of the chain's quorum queues.

    The broker counts only the queues the patterns match and moves leaders
    off every node that leads more than ⌈queues/nodes⌉ of them, by Raft
    leadership transfer: the messages stay where they are.
    """
    return [
        "rebalance",
        "quorum",
        "--vhost-pattern",
        f"^{regex_literal(vhost)}$",
        "--queue-pattern",
        _chain_pattern(topology),
    ]


def rebalance_command(topology: DelayTopology, *, vhost: str = "/") -> str:
    """The shell command an operator runs on a broker node to spread an existing chain."""
    return shlex.join(["rabbitmq-queues", *rebalance_args(topology, vhost=vhost)])


@dataclass(frozen=True, kw_only=True)
class LeaderSpread:
    """Which node leads each level queue of a chain, and how many each node leads."""

    levels: Mapping[str, str | None]
    """Level queue name → its leader's node name (``None``: unknown or no leader)."""
    per_node: Mapping[str, int]
    """Node name → how many level queues it leads, most first."""

    @property
    def busiest(self) -> tuple[str, int] | None:
        """The node leading most levels and how many, or ``None`` if no leader is known."""
        return next(iter(self.per_node.items()), None)


def leader_spread(topology: DelayTopology, leaders: Mapping[str, str | None]) -> LeaderSpread:
    """The chain's level leaders out of ``leaders`` (queue name → leader node, any queues)."""
    levels = {
        topology.level_name(level): leaders.get(topology.level_name(level))
        for level in range(topology.levels)
    }
    counts = Counter(node for node in levels.values() if node)
    return LeaderSpread(levels=levels, per_node=dict(counts.most_common()))


def spread_bound(levels: int, nodes: int) -> int:
    """The most level queues one node should lead in a spread chain: ⌈levels/nodes⌉ + 1."""
    return math.ceil(levels / max(nodes, 1)) + 1


def lopsided_warning(
    topology: DelayTopology, spread: LeaderSpread, *, nodes: Iterable[str], vhost: str = "/"
) -> str | None:
    """A warning when one of the running ``nodes`` leads more than :func:`spread_bound` levels.

    ``None`` on a single node, or when the chain is spread.
    """
    count = len(set(nodes))
    busiest = spread.busiest
    if count < 2 or busiest is None:
        return None
    node, led = busiest
    bound = spread_bound(topology.levels, count)
    if led <= bound:
        return None
    return (
        f"node {node!r} leads {led} of the {topology.levels} level queues of the chain "
        f"{topology.prefix!r} (a spread chain leads at most {bound} on any of {count} nodes), "
        "so that node does the Raft leaders' work of the whole chain; spread them with "
        f"'{rebalance_command(topology, vhost=vhost)}' on a broker node, and set the leader "
        "policies first so that queues declared later spread too "
        "('delayed-retry topology rebalance' prints both)"
    )
