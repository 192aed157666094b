"""A 3-node cluster: the node leading the queues every consumer of the library consumes stops.

Every queue is declared through one node, so that node leads them. Two
placements of the consumers (the three service commands and, in the test
process, a decorated consumer, the consumer the router serves and the
collectors):

- on the stopped node itself: they lose their connection, are not ready while
  it is down, reconnect when it is back, and the queues' leaders have moved;
- on another node: they keep their connection; the quorum queues elect new
  leaders and the consumers go on, ready, while the old leader is still down.

Either way NEW messages sent after the fault arrive on each path: once, not
before they are due. With the chain's leader policies set first (``spread``), the
levels lead on every node and the stopped node leads only its share of them.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from datetime import timedelta

import pytest

from delayed_retry import DelayTopology
from delayed_retry.chain.leaders import leader_policies
from harness import RabbitMQCluster

from ._fleet import (
    SERVICES,
    ServiceProcesses,
    consumers_back,
    declare_fleet,
    deliver_round,
    fleet_names,
    in_process,
    remove_fleet,
)

pytestmark = pytest.mark.cluster


@pytest.fixture
def chain(
    cluster: RabbitMQCluster, request: pytest.FixtureRequest
) -> Iterator[tuple[DelayTopology, dict[str, str], int]]:
    """A fleet's queues, all declared through one node; the index of the node that leads the
    front door's queue. ``one-node``: that node leads every queue; ``spread``: the leader
    policies are set first, so the chain's levels lead on every node."""
    topology = DelayTopology(
        prefix=f"crc-{secrets.token_hex(3)}", levels=12, unit=timedelta(milliseconds=1)
    )
    callspec = getattr(request.node, "callspec", None)
    spread = callspec is not None and callspec.params.get("leaders") == "spread"
    major = 3 if cluster.version in (None, "3.10") else 4
    policies = leader_policies(topology, broker_major=major) if spread else []
    for policy in policies:
        cluster.nodes[0].rabbitmqctl(*policy.rabbitmqctl_args())
    names = fleet_names(topology.prefix)
    asyncio.run(declare_fleet(cluster.urls[0], topology, names))
    leader = cluster.leader_of(f"{names['door_exchange']}.delay")
    try:
        yield topology, names, leader
    finally:
        cluster.ensure_all_running()
        for policy in policies:
            cluster.nodes[0].rabbitmqctl("clear_policy", "--vhost", "/", policy.name)
        asyncio.run(remove_fleet(cluster.urls[0], topology, names))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("placement", ["on the leader's node", "on another node"])
def test_every_consumer_takes_new_messages_after_the_leaders_node_stops(
    cluster: RabbitMQCluster,
    chain: tuple[DelayTopology, dict[str, str], int],
    placement: str,
) -> None:
    topology, names, leader = chain
    other = (leader + 1) % 3
    where = leader if placement == "on the leader's node" else other
    services = ServiceProcesses(cluster.urls[where], topology=topology, names=names)
    try:
        services.start()
        asyncio.run(_run(cluster, services, topology, names, leader, where, other))
    finally:
        outputs = services.stop()
        print("\n".join(f"--- {s}\n{out[-3000:]}" for s, out in outputs.items()))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("leaders", ["spread"])
def test_consumers_take_new_messages_after_a_node_stops_with_the_chain_spread(
    cluster: RabbitMQCluster, chain: tuple[DelayTopology, dict[str, str], int], leaders: str
) -> None:
    # The same fault with the chain's levels led on every node: the stopped node leads its
    # share of them (and the front door's queue); consumers on another node go on.
    del leaders  # read by the chain fixture
    topology, names, leader = chain
    other = (leader + 1) % 3
    services = ServiceProcesses(cluster.urls[other], topology=topology, names=names)
    try:
        services.start()
        asyncio.run(_run(cluster, services, topology, names, leader, other, other))
    finally:
        outputs = services.stop()
        print("\n".join(f"--- {s}\n{out[-3000:]}" for s, out in outputs.items()))


async def _run(
    cluster: RabbitMQCluster,
    services: ServiceProcesses,
    topology: DelayTopology,
    names: dict[str, str],
    leader: int,
    where: int,
    other: int,
) -> None:
    fault = f"the leader's node stopped (consumers on node {where}, leader {leader})"
    async with in_process(cluster.urls[where], topology, names) as fleet:
        await asyncio.to_thread(cluster.stop_node, leader)
        if where == leader:
            down = await asyncio.to_thread(services.wait_all, 503)
            for service in SERVICES:
                assert down[service]["checks"]["connected"] is False, (service, down)
            await asyncio.to_thread(cluster.start_node, leader)
        # Consuming again, with the broker's word for it, on every service.
        up = await asyncio.to_thread(services.wait_all, 200)
        for service in SERVICES:
            assert up[service]["checks"]["broker_sees_consumers"] is True, (service, up)
            assert all(c["in_place"] for c in up[service]["consumers"].values()), (service, up)
        if where != leader:
            assert not cluster.nodes[leader].running  # the messages go while it is down
            assert cluster.leader_of(f"{names['door_exchange']}.delay") != leader
        await consumers_back(cluster.urls[other], names)
        await deliver_round(cluster.urls[other], topology, names, fleet, fault=fault)
