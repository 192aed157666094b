"""Fixtures for the reliability tests: private nodes that a test may break, and a channel."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from harness import RabbitMQNode
from tests.support.nodes import private_node


@pytest.fixture(scope="module")
def node() -> Iterator[RabbitMQNode]:
    """A private RabbitMQ node for one test module: stopped, killed, alarmed at will."""
    yield from private_node()


@pytest.fixture
def running_node(node: RabbitMQNode) -> Iterator[RabbitMQNode]:
    """The module's node, started again after a test that stopped or killed it."""
    yield node
    if not node.running:
        node.start()


@pytest.fixture
async def channel(rabbitmq_url: str) -> AsyncIterator[AbstractChannel]:
    """A channel on the shared broker, its connection closed after the test.

    For tests whose faults are in the consumer (a process killed or stopped), not the
    broker; a module that breaks its private node defines its own ``channel`` on it.
    """
    connection = await aio_pika.connect_robust(rabbitmq_url)
    try:
        yield await connection.channel()
    finally:
        await connection.close()
