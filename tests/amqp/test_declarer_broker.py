"""Declaring on a real broker, once per connection: idempotent, once under concurrency, again
after a reconnect."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import consume, declare_topology, publish_delayed, with_delayed_retry
from delayed_retry.amqp import declarer as declarer_module
from tests.support.chain import Inbox, Scenario, publish

pytestmark = pytest.mark.broker


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[object]:
    """Wrap the step ``<name>`` where the declarer finds it, to record its calls; the broker does
    the work."""
    calls: list[object] = []
    real = getattr(declarer_module, name)

    async def counting(*args: Any, **kwargs: Any) -> None:
        calls.append(args)
        await real(*args, **kwargs)

    monkeypatch.setattr(declarer_module, name, counting)
    return calls


async def test_declaring_twice_and_from_another_connection_is_harmless(
    scenario: Scenario, rabbitmq_url: str
) -> None:
    queue = await scenario.queue()
    await declare_topology(scenario.ch, scenario.topology, queues=[queue.name])
    await declare_topology(scenario.ch, scenario.topology, queues=[queue.name])
    other = await aio_pika.connect(rabbitmq_url)
    try:
        await declare_topology(await other.channel(), scenario.topology, queues=[queue.name])
    finally:
        await other.close()
    inbox = Inbox()
    await queue.consume(inbox)
    await publish_delayed(
        scenario.ch,
        aio_pika.Message(b"once"),
        queue=queue.name,
        delay=0.05,
        topology=scenario.topology,
    )
    assert (await inbox.get()).message.body == b"once"
    # Bindings are a set: declaring three times delivers one copy, not three.
    await publish(scenario.ch, queue.name, b"marker")
    assert (await inbox.get()).message.body == b"marker"


async def test_a_new_connection_declares_again(quorum: Scenario, rabbitmq_url: str) -> None:
    await declare_topology(quorum.ch, quorum.topology)
    level = quorum.topology.level_name(2)
    await quorum.ch.queue_delete(level)
    other = await aio_pika.connect(rabbitmq_url)  # as after a reconnect: a new cache
    try:
        await declare_topology(await other.channel(), quorum.topology)
    finally:
        await other.close()
    assert await quorum.depth(level) == 0  # passive declare finds it again


async def test_concurrent_first_use_declares_once(
    quorum: Scenario, rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topology_calls = count_calls(monkeypatch, "declare_in_full")
    queue = await quorum.queue()
    inbox = Inbox()
    await queue.consume(inbox)
    fresh = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await fresh.channel()
        await asyncio.gather(
            *(
                publish_delayed(
                    channel,
                    aio_pika.Message(str(i).encode()),
                    queue=queue.name,
                    delay=0.05,
                    topology=quorum.topology,
                )
                for i in range(8)
            ),
            declare_topology(channel, quorum.topology, queues=[queue.name]),
            declare_topology(channel, quorum.topology),
        )
    finally:
        await fresh.close()
    assert len(topology_calls) == 1
    assert sorted(int(a.message.body) for a in await inbox.take(8)) == list(range(8))


async def test_concurrent_first_messages_declare_the_destination_once(
    quorum: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_calls = count_calls(monkeypatch, "declare_queue")
    topology_calls = count_calls(monkeypatch, "declare_in_full")
    done: asyncio.Queue[bytes] = asyncio.Queue()

    @with_delayed_retry(topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        done.put_nowait(message.body)

    queue = await quorum.queue()
    for i in range(6):
        await publish(quorum.ch, queue.name, str(i).encode())
    await queue.consume(handler.for_queue(queue.name))  # no declare before the first message
    got = [await asyncio.wait_for(done.get(), 15) for _ in range(6)]
    assert sorted(got) == [str(i).encode() for i in range(6)]
    assert len(topology_calls) == 1
    parking = quorum.topology.default_parking_queue(queue.name)
    assert [args[1].name for args in queue_calls].count(parking) == 1  # type: ignore[index]
    await consume(queue, handler)  # later declarations on this connection are cached
    assert len(topology_calls) == 1


async def test_scheduling_first_does_not_stop_consume_declaring_parking(quorum: Scenario) -> None:
    queue = await quorum.queue()
    # Scheduling binds the queue to the chain but, rightly, declares no parking queue…
    await publish_delayed(
        quorum.ch, aio_pika.Message(b"x"), queue=queue.name, delay=0, topology=quorum.topology
    )
    handled: asyncio.Queue[bytes] = asyncio.Queue()

    @with_delayed_retry(topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        handled.put_nowait(message.body)

    # …and a consumer of the same queue on the same connection must still get its parking.
    await consume(queue, handler)
    assert await quorum.depth(quorum.topology.default_parking_queue(queue.name)) == 0
    assert await asyncio.wait_for(handled.get(), 15) == b"x"
