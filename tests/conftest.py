"""Shared fixtures: a real broker (`rabbitmq_url`, `connection`), names, delay-chain
scenarios (`scenario`, `quorum`; `lot`, with a work queue and its parking queue), a chain of
a test's own (`topology`), the OpenTelemetry SDK in memory (`telemetry`), a local cluster.

A missing broker fails the tests that need one, with the reason; nothing is skipped.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import AsyncIterator, Iterator

import aio_pika
import pytest
from aio_pika.abc import AbstractRobustConnection

from delayed_retry import DelayTopology
from harness import BrokerHarnessError, RabbitMQCluster, broker_url
from tests.support.chain import Scenario, open_scenario
from tests.support.nodes import CONFIRM_TIMEOUT_MS, starts_own_node
from tests.support.queues import cleaned
from tests.support.telemetry import Telemetry, make_telemetry


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Mark by fixture use, so `-m "not cluster"` works without remembering markers.
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "cluster" in fixtures:
            item.add_marker(pytest.mark.cluster)
        own_node = any(starts_own_node(name) for name in fixtures)
        if own_node:
            item.add_marker(pytest.mark.private_node)
        # Anything that reaches or starts a RabbitMQ node is a broker test, so that
        # `-m "not broker"` runs without one.
        if (
            own_node
            or {"rabbitmq_url", "cluster"} & set(fixtures)
            or (
                # The soak and the container tests bring brokers of their own.
                item.get_closest_marker("soak") is not None
                or item.get_closest_marker("container") is not None
            )
        ):
            item.add_marker(pytest.mark.broker)


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """URL of the broker the whole session shares: RABBITMQ_URL, a container or a private node."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(broker_url())
        except BrokerHarnessError as exc:
            pytest.fail(f"no RabbitMQ broker for this test: {exc}", pytrace=False)
        yield url


@pytest.fixture
async def connection(rabbitmq_url: str) -> AsyncIterator[AbstractRobustConnection]:
    """A robust connection to the shared broker, closed after the test."""
    conn = await aio_pika.connect_robust(rabbitmq_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A name prefix no other test uses, like ``t-test-retry-once-3fa9c1``, for queues."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:60]
    return f"t-{slug}-{secrets.token_hex(3)}"


@pytest.fixture(params=["quorum", "classic"])
async def scenario(
    request: pytest.FixtureRequest,
    connection: AbstractRobustConnection,
    unique: str,
    rabbitmq_url: str,
) -> AsyncIterator[Scenario]:
    """A :class:`~tests.support.chain.Scenario` on a chain of its own, once per queue type."""
    async with open_scenario(connection, unique, rabbitmq_url, request.param) as opened:
        yield opened


@pytest.fixture
async def quorum(
    connection: AbstractRobustConnection, unique: str, rabbitmq_url: str
) -> AsyncIterator[Scenario]:
    """A :class:`~tests.support.chain.Scenario` on a quorum chain of its own."""
    async with open_scenario(connection, unique, rabbitmq_url, "quorum") as opened:
        yield opened


@pytest.fixture
async def lot(
    connection: AbstractRobustConnection, unique: str, rabbitmq_url: str
) -> AsyncIterator[Scenario]:
    """A classic 16-level chain (delays up to 65 s) of its own with the work queue
    ``<unique>.orders``, its parking queue cleaned up after: the parking lot of the web view's
    and the parking tools' tests."""
    async with open_scenario(connection, unique, rabbitmq_url, "classic") as scenario:
        scenario.track_queue(scenario.name("orders"), scenario.name("orders") + ".parking")
        yield scenario


@pytest.fixture
async def topology(
    connection: AbstractRobustConnection, unique: str
) -> AsyncIterator[DelayTopology]:
    """A classic chain of 16 levels (delays up to about 65 s) named after the test, deleted
    after it with the queues ``<unique>.q`` and ``<unique>.other`` the test may consume.

    For a test that declares its own queues; :func:`scenario` and :func:`quorum` make the
    queues and channels too.
    """
    topo = DelayTopology(prefix=unique, levels=16, queue_type="classic")
    async with cleaned(connection, topo, [f"{unique}.q", f"{unique}.other"]):
        yield topo


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """An OpenTelemetry SDK recording spans and metrics in memory, shut down after the test."""
    made = make_telemetry()
    yield made
    made.shutdown()


@pytest.fixture(scope="session")
def _cluster_session() -> Iterator[RabbitMQCluster]:
    cluster = RabbitMQCluster(
        size=3, rabbit_env={"dead_letter_worker_publisher_confirm_timeout": CONFIRM_TIMEOUT_MS}
    )
    with contextlib.closing(cluster):
        try:
            cluster.start()
        except BrokerHarnessError as exc:
            pytest.fail(f"could not start a 3-node RabbitMQ cluster: {exc}", pytrace=False)
        yield cluster


@pytest.fixture
def cluster(_cluster_session: RabbitMQCluster) -> Iterator[RabbitMQCluster]:
    """A 3-node cluster shared by the session; nodes a test stopped or killed are started again."""
    yield _cluster_session
    _cluster_session.ensure_all_running()
