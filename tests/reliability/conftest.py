"""Fixtures for the reliability tests: private nodes that a test may break."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from delayed_retry.testing import BrokerHarnessError, RabbitMQNode


@pytest.fixture(scope="module")
def node() -> Iterator[RabbitMQNode]:
    """A private RabbitMQ node for one test module: stopped, killed, alarmed at will."""
    started = RabbitMQNode()
    try:
        started.start()
    except BrokerHarnessError as exc:
        started.close()
        pytest.fail(f"could not start a private RabbitMQ node: {exc}", pytrace=False)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def running_node(node: RabbitMQNode) -> Iterator[RabbitMQNode]:
    """The module's node, started again after a test that stopped or killed it."""
    yield node
    if not node.running:
        node.start()
