"""``teardown`` and ``declare --bind --create`` against a real broker."""

from __future__ import annotations

import asyncio
import json

import aio_pika
import aiormq
import pytest

from delayed_retry import DelayTopology, publish_delayed
from delayed_retry.cli import main
from tests.support.queues import delete_all

pytestmark = pytest.mark.broker


async def _exists(url: str, queue: str) -> bool:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        try:
            await channel.declare_queue(queue, passive=True)
            return True
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False


async def _exchange_exists(url: str, name: str) -> bool:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        try:
            await channel.declare_exchange(name, passive=True)
            return True
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False


async def _delete(url: str, topology: DelayTopology, queues: list[str]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        await delete_all(connection, topology=topology, queues=queues)


async def _schedule_one(url: str, topology: DelayTopology, queue: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await publish_delayed(
            channel, aio_pika.Message(b"x"), queue=queue, delay=3600, topology=topology
        )


def test_declare_creates_the_queue_it_binds_and_teardown_removes_an_empty_chain(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = DelayTopology(prefix=unique, levels=24, queue_type="classic")
    topo = ["--prefix", unique, "--levels", "24", "--queue-type", "classic"]
    url = ["--url", rabbitmq_url]
    try:
        assert main([*url, "declare", *topo, "--bind", unique]) == 2
        assert f"queue {unique!r} does not exist" in capsys.readouterr().err
        assert main([*url, "declare", *topo, "--bind", unique, "--create"]) == 0
        assert f"created queue {unique!r} (classic)" in capsys.readouterr().out
        assert asyncio.run(_exists(rabbitmq_url, unique))

        # A waiting message blocks the teardown, which names the queue and removes nothing.
        asyncio.run(_schedule_one(rabbitmq_url, topology, unique))
        teardown = [*url, "teardown", *topo, "--queue", unique]
        assert main([*teardown, "--yes"]) == 1
        captured = capsys.readouterr()
        assert f"✗ queue '{unique}.level.21' holds 1 message(s)" in captured.out
        assert f"chain {unique!r} is not empty ({unique}.level.21); nothing removed" in (
            captured.err
        )
        assert asyncio.run(_exists(rabbitmq_url, f"{unique}.level.00"))

        connection_purge = asyncio.run(_purge(rabbitmq_url, f"{unique}.level.21"))
        assert connection_purge == 1

        assert main([*teardown, "--dry-run", "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert f"{unique}.parking" in plan["queues"]  # declared with the binding
        assert f"{unique}.level.23" in plan["queues"] and plan["not_empty"] == {}
        assert len(plan["exchanges"]) == 4 + 24
        assert asyncio.run(_exists(rabbitmq_url, f"{unique}.level.23"))

        # Not a terminal and no --yes: a usage error, nothing removed.
        assert main(teardown) == 2
        assert "needs a confirmation: run it on a terminal or add --yes" in (
            capsys.readouterr().err
        )

        assert main([*teardown, "--yes"]) == 0
        assert f"removed chain {unique!r}: 28 queue(s), 28 exchange(s)" in (capsys.readouterr().out)
        assert not asyncio.run(_exists(rabbitmq_url, f"{unique}.level.00"))
        assert not asyncio.run(_exchange_exists(rabbitmq_url, f"{unique}.delivery-24"))
        assert asyncio.run(_exists(rabbitmq_url, unique))  # the consumers' queue stays

        assert main([*teardown, "--yes"]) == 0
        assert "nothing to remove" in capsys.readouterr().out
    finally:
        asyncio.run(_delete(rabbitmq_url, topology, [unique]))


async def _purge(url: str, queue: str) -> int:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        result = await (await channel.get_queue(queue)).purge()
        return int(result.message_count or 0)
