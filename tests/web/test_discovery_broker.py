"""Finding parking queues, and the chain's leaders, through a real management API (a private
node with the plugin)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import aio_pika
import aiohttp
import pytest

from delayed_retry import declare_topology
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.errors import ConfigurationError
from delayed_retry.web import WebSettings
from delayed_retry.web.discovery import discover_queues
from harness import RabbitMQNode
from tests.support.nodes import private_node_with_management
from tests.support.queues import delete_all
from tests.support.web import serve

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def management_node() -> Iterator[tuple[RabbitMQNode, str]]:
    """A private node with rabbitmq_management on a free loopback port."""
    for node, port in private_node_with_management():
        yield node, f"http://127.0.0.1:{port}"


async def test_discovery_lists_work_queues_that_have_a_parking_queue(
    management_node: tuple[RabbitMQNode, str],
) -> None:
    node, management = management_node
    connection = await aio_pika.connect(node.url)
    async with connection:
        channel = await connection.channel()
        for name in ("orders", "orders.parking", "invoices.parking", "audit"):
            await channel.declare_queue(name, durable=True)
        found: list[str] = []
        for _ in range(100):  # the management API's queue list lags declarations a little
            found = await discover_queues(
                node.url, topology=DelayTopology(), management_url=management
            )
            if len(found) == 2:
                break
            await asyncio.sleep(0.1)
        assert found == ["invoices", "orders"]
        for name in ("orders", "orders.parking", "invoices.parking", "audit"):
            await channel.queue_delete(name)

    wrong = node.url.replace("guest:guest", "guest:wrong")
    with pytest.raises(ConfigurationError, match=r"answered 401.*--queue"):
        await discover_queues(wrong, topology=DelayTopology(), management_url=management)


async def test_the_overview_shows_the_chains_leaders_per_node(
    management_node: tuple[RabbitMQNode, str],
) -> None:
    node, management = management_node
    topology = DelayTopology(prefix=f"web-leaders-{secrets.token_hex(3)}", levels=5)
    connection = await aio_pika.connect(node.url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        await channel.declare_queue("orders", durable=True)
        settings = WebSettings(
            url=node.url, queues=("orders",), topology=topology, management_url=management
        )
        try:
            async with (
                serve(settings) as base,
                aiohttp.ClientSession() as session,
                session.get(base + "/") as response,
            ):
                page = await response.text()
            assert 'id="leaders"' in page
            assert f'<span class="mono">{node.name}</span> 5' in page
            assert "leaders-warning" not in page  # one node: nothing to spread over
        finally:
            await delete_all(channel, queues=["orders"], topology=topology)
