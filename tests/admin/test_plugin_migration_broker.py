"""``delayed-retry migrate-plugin`` against a private node with the management plugin.

The delayed-message plugin cannot be installed here, so a topic exchange with
an ``x-delayed-type`` argument stands in for the plugin's exchange: the
command reads its definition and bindings the same way.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import aio_pika
import pytest

from delayed_retry.admin.management import ManagementClient
from delayed_retry.admin.plugin_migration import MigrationError, read_exchange
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli.main import main
from delayed_retry.delivery.front_door import (
    FrontDoor,
)
from delayed_retry.headers import (
    X_DELAY,
)
from harness.node import RabbitMQNode
from tests.support.nodes import private_node_with_management

pytestmark = [pytest.mark.private_node, pytest.mark.timeout(180)]

TOPOLOGY = DelayTopology(prefix="mig", levels=12)


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[RabbitMQNode, str]]:
    """A private node with rabbitmq_management; never the shared broker."""
    for started, port in private_node_with_management():
        yield started, f"http://guest:guest@127.0.0.1:{port}"


def _api(management: str, path: str) -> Any:
    request = urllib.request.Request(management.replace("guest:guest@", "") + path)
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _bindings(management: str, exchange: str) -> set[tuple[str, str, str]]:
    rows = _api(management, f"/api/exchanges/%2F/{exchange}/bindings/source")
    return {(r["destination_type"], r["destination"], r["routing_key"]) for r in rows}


async def _stand_in(url: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        ch = await connection.channel()
        x = await ch.declare_exchange(
            "orders", "topic", durable=True, arguments={"x-delayed-type": "topic"}
        )
        upstream = await ch.declare_exchange("upstream", "fanout", durable=True)
        await x.bind(upstream)
        for name, key in (("billing", "orders.paid"), ("audit", "orders.#")):
            q = await ch.declare_queue(name, durable=True)
            await q.bind(x, routing_key=key)


def _cli(url: str, management: str, *extra: str) -> int:
    return main(
        [
            "--url",
            url,
            "migrate-plugin",
            "--exchange",
            "orders",
            "--management-url",
            management,
            "--prefix",
            TOPOLOGY.prefix,
            "--levels",
            str(TOPOLOGY.levels),
            *extra,
        ]
    )


async def test_migrate_plugin_copies_bindings_in_two_stages(
    node: tuple[RabbitMQNode, str], capsys: pytest.CaptureFixture[str]
) -> None:
    broker, management = node
    await _stand_in(broker.url)
    before = _bindings(management, "orders")
    assert before == {("queue", "billing", "orders.paid"), ("queue", "audit", "orders.#")}

    assert await asyncio.to_thread(_cli, broker.url, management, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "x-delayed-type topic, 2 binding(s) out, 1 in" in out
    assert "switch every producer from exchange 'orders' to 'orders.delay'" in out
    exchanges = {e["name"] for e in _api(management, "/api/exchanges/%2F")}
    assert "orders.delay" not in exchanges  # dry run: nothing changed

    assert await asyncio.to_thread(_cli, broker.url, management) == 0
    assert {(t, d) for t, d, _ in _bindings(management, "orders.delay")} == {
        ("queue", "orders.delay")
    }
    assert _api(management, "/api/exchanges/%2F/orders")["arguments"] == {
        "x-delayed-type": "topic"
    }  # prepare leaves the plugin exchange alone

    assert await asyncio.to_thread(_cli, broker.url, management, "--swap") == 0
    swapped = _api(management, "/api/exchanges/%2F/orders")
    assert (swapped["type"], swapped["arguments"]) == ("topic", {})
    assert _bindings(management, "orders") == before
    assert ("exchange", "orders.delay", "") in _bindings(management, "upstream")

    # After the swap the contract holds end to end: upstream -> orders.delay -> orders.
    connection = await aio_pika.connect_robust(broker.url)
    async with connection:
        ch = await connection.channel()
        async with FrontDoor(connection, exchange="orders", topology=TOPOLOGY):
            up = await ch.get_exchange("upstream")
            await up.publish(
                aio_pika.Message(b"paid", headers={X_DELAY: 100}), routing_key="orders.paid"
            )
            billing = await ch.get_queue("billing")
            got = None
            deadline = time.monotonic() + 30
            while got is None:
                assert time.monotonic() < deadline, "the delayed message never reached billing"
                got = await billing.get(fail=False, timeout=5)
                if got is None:
                    await asyncio.sleep(0.1)
            assert got.body == b"paid" and got.headers[X_DELAY] == -100
            await got.ack()


async def test_missing_or_ordinary_exchange_is_refused_with_its_name(
    node: tuple[RabbitMQNode, str],
) -> None:
    _, management = node
    client = ManagementClient(management, vhost="/")
    with pytest.raises(MigrationError, match="exchange 'nowhere' does not exist in vhost '/'"):
        await read_exchange(client, exchange="nowhere")
    with pytest.raises(MigrationError, match="not a delayed-message plugin exchange"):
        await read_exchange(client, exchange="amq.topic")
