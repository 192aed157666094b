"""The local cluster harness: membership, quorum replication, leader failover."""

from __future__ import annotations

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection

from harness import RabbitMQCluster
from tests.support.nodes import CONFIRM_TIMEOUT_MS
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster


def test_three_nodes_run_as_one_cluster(cluster: RabbitMQCluster) -> None:
    names = sorted(node.name for node in cluster.nodes)
    assert len(set(names)) == 3
    for node in cluster.nodes:
        # Ask every node: each must see all three running.
        status = node.rabbitmqctl("cluster_status", "--formatter", "json")
        assert all(name in status for name in names)
    assert sorted(cluster.running_node_names()) == names
    assert len(set(cluster.urls)) == 3


def test_rabbit_env_reaches_every_node(cluster: RabbitMQCluster) -> None:
    for node in cluster.nodes:
        value = node.rabbitmqctl(
            "eval", "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout)."
        )
        assert value.strip() == f"{{ok,{CONFIRM_TIMEOUT_MS}}}", node.name


async def get_with_retry(url: str, queue: str, timeout: float = 60.0) -> bytes:
    """Read one message, retrying while the queue elects a new leader."""
    got: list[bytes] = []
    errors: list[Exception] = []

    async def read() -> bool:
        try:
            connection: AbstractConnection = await aio_pika.connect(url, timeout=5)
            async with connection:
                channel = await connection.channel()
                declared = await channel.get_queue(queue, ensure=True)
                message = await declared.get(no_ack=True, fail=False, timeout=5)
                if message is not None:
                    got.append(message.body)
        except (TimeoutError, aio_pika.exceptions.AMQPError, OSError) as exc:
            errors.append(exc)
        return bool(got)

    try:
        await wait_until(read, timeout=timeout, interval=0.5, what=f"a message in {queue!r}")
    except AssertionError as exc:
        raise AssertionError(f"{exc} at {url}; last error: {errors[-1:]!r}") from None
    return got[0]


async def test_quorum_message_survives_leader_kill(cluster: RabbitMQCluster, unique: str) -> None:
    connection = await aio_pika.connect(cluster.urls[0])
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(unique, durable=True, arguments={"x-queue-type": "quorum"})
        message = aio_pika.Message(b"replicated", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await channel.default_exchange.publish(message, routing_key=unique)
    assert cluster.members_of(unique) == [0, 1, 2]

    leader = cluster.leader_of(unique)
    cluster.kill_node(leader)
    survivor = (leader + 1) % 3
    assert await get_with_retry(cluster.urls[survivor], unique) == b"replicated"
    assert cluster.leader_of(unique) != leader

    connection = await aio_pika.connect(cluster.urls[survivor])
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(unique)
        await queue.delete(if_unused=False, if_empty=False)
