"""Fixtures for the reliability tests: private nodes that a test may break."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness import RabbitMQNode

from ._support import private_node


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
