"""Broker settings the tests' private nodes and cluster run with, and check against; the
naming rule by which a fixture says it starts a node of its own, and the one way to start one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness import BrokerHarnessError, RabbitMQNode


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
