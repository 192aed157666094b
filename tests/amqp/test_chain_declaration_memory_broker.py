"""Where waiting bodies live: the chain's memory policy and the 3.10–3.11 hint.

Pure tests of the version logic, then the policy on a real broker: it must
reach the level queues and nothing else. Level queues that have an in-memory
argument are used as they are (test_chain_declaration_broker.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from urllib.parse import quote

import aio_pika
import pytest

from delayed_retry import DelayTopology, declare_topology
from delayed_retry.rabbitmq.versions import (
    bodies_in_memory_hint,
    broker_version,
    keeps_bodies_in_memory,
)
from harness import RabbitMQNode
from tests.support.nodes import private_node


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (b"3.10.8", (3, 10)),
        ("3.11.28", (3, 11)),
        (b"4.0.5", (4, 0)),
        ("3.13.7+rc.1", (3, 13)),
        ("garbage", None),
        (None, None),
    ],
)
def test_broker_version_from_server_properties(
    version: bytes | str | None, expected: tuple[int, int] | None
) -> None:
    assert broker_version({"version": version}) == expected
    assert broker_version(None) is None


def test_only_3_10_and_3_11_keep_bodies_in_memory() -> None:
    topology = DelayTopology(prefix="orders")
    for version in ((3, 10), (3, 11)):
        assert keeps_bodies_in_memory(version)
        hint = bodies_in_memory_hint(version, topology=topology)
        assert hint is not None
        assert f"RabbitMQ {version[0]}.{version[1]} quorum queues may keep the bodies" in hint
        assert "'orders'" in hint and topology.memory_policy().command() in hint
    for other in ((3, 9), (3, 12), (3, 13), (4, 0), None):
        assert not keeps_bodies_in_memory(other)
        assert bodies_in_memory_hint(other, topology=topology) is None


@pytest.fixture(scope="module")
def node() -> Iterator[RabbitMQNode]:
    """A private node of its own: the test sets an operator policy on its vhost."""
    yield from private_node()


def _operator_policy(node: RabbitMQNode, queue: str) -> str:
    """The operator policy the broker applies to ``queue``, as it prints it."""
    return node.rabbitmqctl(
        "eval",
        '{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, '
        f'<<"{queue}">>)), amqqueue:get_operator_policy(Q).',
    )


async def test_the_memory_policy_reaches_the_level_queues_and_nothing_else(
    node: RabbitMQNode, unique: str
) -> None:
    topology = DelayTopology(prefix=unique, levels=6)
    policy = topology.memory_policy()
    connection = await aio_pika.connect(node.url)
    async with connection:
        channel = await connection.channel()
        destination = f"{unique}.orders"
        await channel.declare_queue(destination, durable=True, arguments={"x-queue-type": "quorum"})
        await declare_topology(channel, topology, queues=[destination])
        node.rabbitmqctl(*policy.rabbitmqctl_args())
        try:
            for level in range(topology.levels):
                applied = _operator_policy(node, topology.level_name(level))
                assert policy.name in applied and "max-in-memory-length" in applied
            others = [s.name for s in topology.queues() if not topology.is_level_queue(s.name)]
            for name in [*others, destination, topology.default_parking_queue(destination)]:
                assert policy.name not in _operator_policy(node, name), name
            # The chain's arguments are untouched: declaring again agrees, from any version.
            fresh = await aio_pika.connect(node.url)
            async with fresh:
                await declare_topology(await fresh.channel(), topology, queues=[destination])
        finally:
            node.rabbitmqctl("clear_operator_policy", policy.name)


async def test_the_start_up_hint_sets_the_policy_on_the_vhost_the_chain_is_on(
    node: RabbitMQNode, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Pasting the hint must act where the chain is: a command that says --vhost / would set
    # the policy on someone else's vhost and leave this chain's bodies in memory.
    vhost = f"{unique}-team"
    node.rabbitmqctl("add_vhost", vhost)
    try:
        node.rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        topology = DelayTopology(prefix=unique, levels=3)
        caplog.set_level("INFO", logger="delayed_retry")
        async with await aio_pika.connect(node.url + quote(vhost, safe="")) as connection:
            await declare_topology(await connection.channel(), topology)
        hints = [r.getMessage() for r in caplog.records if "operator policy" in r.getMessage()]
        assert len(hints) == 1, caplog.text
        command = shlex.split(hints[0].rsplit(": ", 1)[1])
        assert command[:1] == ["rabbitmqctl"] and ["--vhost", vhost] == command[2:4], command
        node.rabbitmqctl(*command[1:])
        applied = node.rabbitmqctl(
            "eval",
            f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, '
            f'<<"{topology.level_name(0)}">>)), amqqueue:get_operator_policy(Q).',
        )
        assert topology.memory_policy().name in applied
    finally:
        node.rabbitmqctl("delete_vhost", vhost)
