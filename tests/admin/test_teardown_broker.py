"""``teardown`` (classic and quorum chains) and ``declare --bind --create`` on a real broker."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from datetime import timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractRobustConnection

from delayed_retry import DelayTopology, publish_delayed
from delayed_retry.admin.teardown import plan_teardown, tear_down
from delayed_retry.amqp.declarer import declare_topology
from delayed_retry.cli import main
from delayed_retry.delivery.front_door import FrontDoor
from tests.support.queues import cleaned, delete_all, depth, exists, wait_for_depth

pytestmark = pytest.mark.broker


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
        assert main([*url, "declare", *topo, "--bind", unique]) == 1
        assert f"queue {unique!r} does not exist" in capsys.readouterr().err
        assert main([*url, "declare", *topo, "--bind", unique, "--create"]) == 0
        assert f"created queue {unique!r} (classic)" in capsys.readouterr().out
        assert asyncio.run(exists(rabbitmq_url, unique))

        # A waiting message blocks the teardown, which names the queue and removes nothing.
        asyncio.run(_schedule_one(rabbitmq_url, topology, unique))
        teardown = [*url, "teardown", *topo, "--queue", unique]
        assert main([*teardown, "--yes"]) == 1
        captured = capsys.readouterr()
        assert f"✗ queue '{unique}.level.21' holds 1 message(s)" in captured.out
        assert f"chain {unique!r} is not empty ({unique}.level.21); nothing removed" in (
            captured.err
        )
        assert asyncio.run(exists(rabbitmq_url, f"{unique}.level.00"))

        connection_purge = asyncio.run(_purge(rabbitmq_url, f"{unique}.level.21"))
        assert connection_purge == 1

        assert main([*teardown, "--dry-run", "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert f"{unique}.parking" in plan["queues"]  # declared with the binding
        assert f"{unique}.level.23" in plan["queues"] and plan["not_empty"] == {}
        assert len(plan["exchanges"]) == 4 + 24
        assert asyncio.run(exists(rabbitmq_url, f"{unique}.level.23"))

        # Not a terminal and no --yes: a usage error, nothing removed.
        assert main(teardown) == 2
        assert "needs a confirmation: run it on a terminal or add --yes" in (
            capsys.readouterr().err
        )

        assert main([*teardown, "--yes"]) == 0
        assert f"removed chain {unique!r}: 28 queue(s), 28 exchange(s)" in (capsys.readouterr().out)
        assert not asyncio.run(exists(rabbitmq_url, f"{unique}.level.00"))
        assert not asyncio.run(exists(rabbitmq_url, f"{unique}.delivery-24", kind="exchange"))
        assert asyncio.run(exists(rabbitmq_url, unique))  # the consumers' queue stays

        assert main([*teardown, "--yes"]) == 0
        assert "nothing to remove" in capsys.readouterr().out
    finally:
        asyncio.run(delete_all(rabbitmq_url, topology=topology, queues=[unique]))


async def _purge(url: str, queue: str) -> int:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        result = await (await channel.get_queue(queue)).purge()
        return int(result.message_count or 0)


async def _publish_to_nowhere(url: str, topology: DelayTopology) -> None:
    """A message into the chain for a queue nothing binds: it ends in the unroutable queue,
    and the alert queue gets a copy."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        route = topology.route(5, "nowhere")
        exchange = await channel.get_exchange(route.exchange)
        await exchange.publish(aio_pika.Message(b"lost"), routing_key=route.routing_key)
        await wait_for_depth(connection, topology.unroutable_queue, 1)
        await wait_for_depth(connection, topology.alerts_queue, 1)


def test_a_quorum_chain_is_torn_down_once_what_blocks_it_is_emptied_as_the_refusal_says(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = DelayTopology(prefix=unique, levels=6)  # quorum: queue.delete refuses if-empty
    url = ["--url", rabbitmq_url]
    topo = ["--prefix", unique, "--levels", "6"]
    teardown = [*url, "teardown", *topo]
    try:
        assert main([*url, "declare", *topo]) == 0
        assert "(quorum)" in capsys.readouterr().out
        asyncio.run(_publish_to_nowhere(rabbitmq_url, topology))

        # Each queue in the way is named with its count and what empties it; nothing goes.
        assert main([*teardown, "--yes"]) == 1
        captured = capsys.readouterr()
        unroutable, alerts = topology.unroutable_queue, topology.alerts_queue
        assert f"✗ queue {unroutable!r} holds 1 message(s)" in captured.out
        assert f"chain {unique!r} is not empty ({unroutable}, {alerts}); nothing removed" in (
            captured.err
        )
        assert f"✗ queue {alerts!r} holds 1 message(s): add --purge-alerts" in captured.out
        assert len(captured.err.strip().splitlines()) == 1 and "holds" not in captured.err
        assert "cannot reach" not in captured.err
        assert asyncio.run(exists(rabbitmq_url, topology.level_name(0)))

        # The command the refusal gives for the unroutable queue empties it.
        purge = re.search(r"'delayed-retry (parking purge [^']*)'", captured.out)
        assert purge is not None and f"--parking-queue {unroutable}" in purge.group(1)
        assert main([*url, *shlex.split(purge.group(1)), "--yes"]) == 0
        assert "purged 1 message(s)" in capsys.readouterr().out

        assert main([*teardown, "--purge-alerts", "--yes"]) == 0
        out = capsys.readouterr().out
        assert f"removed chain {unique!r}: 9 queue(s), 10 exchange(s)" in out
        for name in (topology.level_name(5), topology.level_name(0), unroutable, alerts):
            assert not asyncio.run(exists(rabbitmq_url, name)), name
        assert not asyncio.run(exists(rabbitmq_url, topology.level_name(0), kind="exchange"))
    finally:
        asyncio.run(delete_all(rabbitmq_url, topology=topology))


async def test_a_quorum_queue_that_receives_a_message_after_the_plan_stops_the_teardown(
    connection: AbstractRobustConnection, unique: str
) -> None:
    # Levels of a minute: a message put in level 2 stays there for the test.
    topology = DelayTopology(prefix=unique, levels=4, unit=timedelta(minutes=1))
    async with cleaned(connection, topology, []):
        channel = await connection.channel()
        await declare_topology(channel, topology)
        plan = await plan_teardown(connection, topology)
        assert not plan.blocked and plan.queues[:4] == [
            topology.level_name(n) for n in (3, 2, 1, 0)
        ]
        assert plan.queue_types[topology.level_name(2)] == "quorum"
        assert plan.queue_types[topology.alerts_queue] == "classic"

        await channel.default_exchange.publish(
            aio_pika.Message(b"late"), routing_key=topology.level_name(2)
        )
        await wait_for_depth(connection, topology.level_name(2), 1)
        outcome = await tear_down(connection, plan)

        assert outcome.refused == topology.level_name(2)
        assert outcome.reason == "holds 1 message(s)"
        assert outcome.queues == [topology.level_name(3)] and outcome.exchanges == []
        assert await depth(connection, topology.level_name(2)) == 1  # kept, with its message
        assert await depth(connection, topology.level_name(0)) == 0  # the queues after it too
        assert await exists(connection, topology.alerts_queue)
        assert not await exists(connection, topology.level_name(3))


async def test_a_queue_with_consumers_blocks_the_teardown(
    connection: AbstractRobustConnection, unique: str
) -> None:
    topology = DelayTopology(prefix=unique, levels=2)
    async with cleaned(connection, topology, []):
        channel = await connection.channel()
        await declare_topology(channel, topology)
        rejected = await channel.get_queue(topology.rejected_queue)

        async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await message.ack()

        tag = await rejected.consume(handle)
        plan = await plan_teardown(connection, topology)
        assert plan.blocked and plan.consumers == {topology.rejected_queue: 1}
        assert topology.rejected_queue not in plan.queues
        await rejected.cancel(tag)


async def test_a_broker_refusal_is_reported_as_a_refusal_not_as_an_unreachable_broker(
    connection: AbstractRobustConnection,
    rabbitmq_url: str,
    unique: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Another connection's exclusive queue: a passive declare is refused (RESOURCE_LOCKED).
    channel = await connection.channel()
    locked = await channel.declare_queue(f"{unique}.parking", exclusive=True)
    argv = ["--url", rabbitmq_url, "teardown", "--prefix", unique, "--levels", "2"]
    code = await asyncio.to_thread(main, [*argv, "--queue", unique, "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "refused an operation of this command: RESOURCE_LOCKED" in err[0]
    assert f"locked queue '{locked.name}'" in err[0]
    assert "cannot reach" not in err[0] and "check the host and port" not in err[0]


async def _open_front_door(url: str, topology: DelayTopology, exchange: str) -> None:
    """Start and stop a front door for ``exchange``: what it declared stays, and a message
    scheduled for ``exchange`` waits in the chain."""
    connection = await aio_pika.connect(url)
    async with connection:
        async with FrontDoor(connection, exchange=exchange, topology=topology):
            pass
        channel = await connection.channel()
        await publish_delayed(
            channel, aio_pika.Message(b"x"), exchange=exchange, delay=3600, topology=topology
        )


def test_teardown_removes_forwarding_when_named_and_discards_waiting_messages_when_confirmed(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = DelayTopology(prefix=unique, levels=24, queue_type="classic")
    topo = ["--prefix", unique, "--levels", "24", "--queue-type", "classic"]
    teardown = ["--url", rabbitmq_url, "teardown", *topo]
    exchange = f"{unique}-x"
    forwarding = [
        f"{exchange}.delay",
        f"{exchange}.delay.parking",
        f"{unique}.forward.{exchange}",
        f"{unique}.forward.{exchange}.parking",
    ]
    try:
        asyncio.run(_open_front_door(rabbitmq_url, topology, exchange))
        capsys.readouterr()

        # The waiting message blocks: one line per queue in the way, a short refusal.
        assert main([*teardown, "--yes"]) == 1
        out, err = capsys.readouterr()
        blocker = next(line for line in out.splitlines() if line.startswith("✗"))
        assert blocker.startswith(f"✗ queue '{unique}.level.21' holds 1 message(s)")
        assert "add --discard-waiting" in blocker
        assert len(err.strip().splitlines()) == 1 and "holds" not in err, err
        assert f"chain {unique!r} is not empty ({unique}.level.21); nothing removed" in err

        # Discarding is asked for, and confirmed with the count it discards.
        both = [*teardown, "--discard-waiting", "--forward", exchange]
        assert main(both) == 2
        err = capsys.readouterr().err
        assert "discarding the 1 message(s) still waiting in it (never delivered)" in err
        assert "add --yes" in err
        assert asyncio.run(exists(rabbitmq_url, f"{unique}.level.21"))

        assert main([*both, "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert f"queue    {unique}.level.21 (with its 1 message(s), --discard-waiting)" in out
        for name in forwarding:
            assert f"queue    {name}\n" in out, name
        assert f"exchange {exchange}.delay\n" in out

        assert main([*both, "--yes"]) == 0
        out = capsys.readouterr().out
        assert f"removed chain {unique!r}: 31 queue(s), 29 exchange(s)" in out
        for name in [topology.level_name(21), *forwarding]:
            assert not asyncio.run(exists(rabbitmq_url, name)), name
        assert not asyncio.run(exists(rabbitmq_url, f"{exchange}.delay", kind="exchange"))
        assert asyncio.run(exists(rabbitmq_url, exchange, kind="exchange"))  # the application's
    finally:
        asyncio.run(delete_all(rabbitmq_url, topology=topology, queues=forwarding))
        asyncio.run(delete_all(rabbitmq_url, exchanges=[exchange, f"{exchange}.delay"]))
