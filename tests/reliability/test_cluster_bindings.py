"""A binding declared through one node, a message routed by another right after.

RabbitMQ 4.3 keeps its metadata in Khepri: a new binding is committed by a
majority, and another node may route by its own copy a moment later. The
consumer declares its queue's binding to the chain's delivery exchange when it
starts; the first messages may come out of the chain on a node that has not
seen it yet. The promise checked here holds on every version: such a message is
delivered, or kept in ``<prefix>.unroutable`` by the delivery exchange's
alternate exchange, never dropped.
"""

from __future__ import annotations

import aio_pika
import pytest

from delayed_retry import DelayTopology, declare_topology
from delayed_retry.chain.routing_keys import routing_key
from harness import RabbitMQCluster
from tests.support.queues import delete_all, depth
from tests.support.waiting import wait_until

from ._support import QUORUM

pytestmark = pytest.mark.cluster

ROUNDS = 20


@pytest.mark.timeout(300)
async def test_a_binding_made_on_one_node_loses_nothing_routed_by_another(
    cluster: RabbitMQCluster, unique: str
) -> None:
    topology = DelayTopology(prefix=unique, levels=8)
    near = await aio_pika.connect(cluster.urls[0])
    far = await aio_pika.connect(cluster.urls[1])
    queues = [f"{unique}.q{n}" for n in range(ROUNDS)]
    try:
        near_channel = await near.channel()
        far_channel = await far.channel()
        await declare_topology(near_channel, topology)
        delivery = await far_channel.get_exchange(topology.delivery_exchange, ensure=False)
        for queue in queues:
            await near_channel.declare_queue(queue, durable=True, arguments=QUORUM)
            # The consumer's start-up binding, through node 0 ...
            await declare_topology(near_channel, topology, queues=[queue])
            # ... and at once a message out of the chain for it, routed by node 1.
            await delivery.publish(
                aio_pika.Message(queue.encode()), routing_key=routing_key(0, topology.levels, queue)
            )

        async def placed() -> int:
            delivered = [await depth(far, queue) for queue in queues]
            return sum(delivered) + await depth(far, topology.unroutable_queue)

        async def all_placed() -> bool:
            return await placed() == ROUNDS

        await wait_until(all_placed, what=f"all {ROUNDS} messages delivered or kept")
        kept = await depth(far, topology.unroutable_queue)
        print(f"COUNTS cluster-binding-race: delivered={ROUNDS - kept} unroutable={kept}")
    finally:
        await near.close()
        await far.close()
        cleanup = await aio_pika.connect(cluster.urls[0])
        try:
            parking = [topology.default_parking_queue(q) for q in queues]
            await delete_all(cleanup, topology=topology, queues=queues + parking, exchanges=[])
        finally:
            await cleanup.close()
