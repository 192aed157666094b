"""Broker settings the tests' private nodes and cluster run with, and check against; the
naming rule by which a fixture says it starts a node of its own, and the one way to start one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness import BrokerHarnessError, RabbitMQNode, free_port, release_port
from harness.ports import listening


def starts_own_node(fixture: str) -> bool:
    """Whether a fixture of this name starts a RabbitMQ node of its own: ``node`` or ``*_node``.

    ``tests/conftest.py`` marks the tests using one ``private_node`` (``scripts/test-nodes``
    runs them); ``tests/project/test_tests_tree.py`` holds every node-starting fixture to it.
    """
    return fixture == "node" or fixture.endswith("_node")


CONFIRM_TIMEOUT_MS = 10_000
"""``dead_letter_worker_publisher_confirm_timeout`` of the test cluster and the broker-kill node.

A failover or a kill can catch a message between two levels of the chain;
the at-least-once dead-letter worker sends it again when its publish confirm
times out (180 s by default). 10 s keeps these tests about what arrives, not
about that wait.
"""


def private_node(**options: Any) -> Iterator[RabbitMQNode]:
    """Start a :class:`RabbitMQNode` with ``options``, yield it, close it; fail if it won't start.

    For fixtures named ``node`` or ``*_node``: ``yield from private_node(...)``.
    """
    started = RabbitMQNode(**options)
    try:
        started.start()
    except BrokerHarnessError as exc:
        started.close()
        pytest.fail(f"could not start a private RabbitMQ node: {exc}", pytrace=False)
    try:
        yield started
    finally:
        started.close()


def private_node_with_management(**options: Any) -> Iterator[tuple[RabbitMQNode, int]]:
    """:func:`private_node` with the management plugin on a free loopback port: the node and
    that port, once the API listens. Never enable the plugin on the shared broker.

    For fixtures named ``*_node``: ``for node, port in private_node_with_management(): yield
    node, f"http://127.0.0.1:{port}"``.
    """
    port = free_port()
    config = {"management.tcp.port": str(port), "management.tcp.ip": "127.0.0.1"}
    try:
        for node in private_node(plugins=["rabbitmq_management"], config=config, **options):
            deadline = time.monotonic() + 60
            while not listening(port):
                assert time.monotonic() < deadline, f"the management API on port {port} is down"
                time.sleep(0.2)
            yield node, port
    finally:
        release_port(port)
