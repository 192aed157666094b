"""Messages the AMQP client cannot decode, on a queue declared with ``work_queue_arguments``.

pamqp raises while it decodes such a delivery, so aiormq drops the consumer's
connection before any code of delayed-retry sees the message, and the broker
delivers it again, first, at every reconnect. The queue's delivery limit is the
one defence: past it the broker dead-letters the message into the queue's
dead-letter queue (declared by ``consume``), and what is behind it flows again.
These tests publish such messages for real (:mod:`tests.support.undecodable`)
and watch the consumer, the work queue and the dead-letter queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import DelayTopology, consume, with_delayed_retry
from delayed_retry.cli import main
from delayed_retry.parking.records import read_record
from delayed_retry.rabbitmq.work_queues import work_queue_arguments
from tests.support.queues import delete_all, depth
from tests.support.undecodable import NotUtf8, microseconds_now
from tests.support.waiting import wait_until

LIMIT = 3
RECONNECT_INTERVAL = 0.5
"""Seconds between the consumer's reconnects (aio-pika's default is 5)."""


POISONS: dict[str, dict[str, Any]] = {
    "timestamp-property": {"timestamp": microseconds_now()},
    "timestamp-header": {"headers": {"sent-at": microseconds_now()}},
    "nested-timestamp-header": {"headers": {"trace": [{"at": microseconds_now()}]}},
    "header-name-not-utf8": {"headers": {NotUtf8("name"): 1}},
    "content-type-not-utf8": {"content_type": NotUtf8("text/plain")},
    "routing-key-not-utf8": {"routing_key": NotUtf8("key")},
}


@dataclass
class Consumer:
    """A retrying consumer on a work queue declared with ``work_queue_arguments``."""

    queue: str
    dead_letter: str
    publisher: AbstractChannel
    channel: AbstractChannel
    handled: list[bytes] = field(default_factory=list)
    reconnects: int = 0

    async def publish(self, body: bytes, *, routing_key: str | None = None, **props: Any) -> None:
        if routing_key is None:
            await self.publisher.default_exchange.publish(
                aio_pika.Message(body, **props), routing_key=self.queue
            )
            return
        # Any routing key reaches the queue through a fanout exchange bound to it.
        fanout = await self.publisher.declare_exchange(
            f"{self.queue}.fanout", aio_pika.ExchangeType.FANOUT, auto_delete=True
        )
        await (await self.publisher.get_queue(self.queue)).bind(fanout)
        await fanout.publish(aio_pika.Message(body, **props), routing_key=routing_key)


@pytest.fixture
async def start_consumer(
    connection: AbstractRobustConnection, unique: str, rabbitmq_url: str
) -> AsyncIterator[Callable[..., Any]]:
    topology = DelayTopology(prefix=unique, levels=8)
    queue = f"{unique}.work"
    dead_letter = topology.default_dead_letter_queue(queue)
    publisher = await connection.channel()
    robust_connections: list[AbstractRobustConnection] = []

    async def start(*, prefetch: int = 1) -> Consumer:
        # As the README declares its queue: the dead-letter queue is left to consume().
        await publisher.declare_queue(
            queue, durable=True, arguments=work_queue_arguments(queue, delivery_limit=LIMIT)
        )
        robust = await aio_pika.connect_robust(rabbitmq_url, reconnect_interval=RECONNECT_INTERVAL)
        robust_connections.append(robust)
        channel = await robust.channel()
        await channel.set_qos(prefetch_count=prefetch)
        consumer = Consumer(queue, dead_letter, publisher, channel)

        @with_delayed_retry(topology=topology, max_retries=1, wait=tenacity.wait_fixed(0.05))
        async def handle(message: AbstractIncomingMessage) -> None:
            consumer.handled.append(message.body)

        def reconnected(*_: object) -> None:
            consumer.reconnects += 1

        robust.reconnect_callbacks.add(reconnected)
        declared = await channel.declare_queue(
            queue, durable=True, arguments=work_queue_arguments(queue, delivery_limit=LIMIT)
        )
        await consume(declared, handle)
        return consumer

    try:
        yield start
    finally:
        for robust in robust_connections:
            await robust.close()
        await delete_all(connection, queues=[queue, dead_letter], topology=topology)


def dead_lettered(
    connection: AbstractRobustConnection, consumer: Consumer, count: int
) -> Callable[[], Any]:
    async def reached() -> bool:
        return await depth(connection, consumer.dead_letter) == count

    return reached


@pytest.mark.parametrize("poison", sorted(POISONS))
async def test_an_undecodable_message_is_moved_aside_and_the_next_one_is_handled(
    start_consumer: Callable[..., Any], connection: AbstractRobustConnection, poison: str
) -> None:
    consumer = await start_consumer()
    await consumer.publish(b"before")
    await wait_until(lambda: consumer.handled == [b"before"], what="the first message handled")

    await consumer.publish(b"poison", **POISONS[poison])
    await consumer.publish(b"after")

    # Each delivery of the poison drops the connection; past the limit the broker moves it.
    await wait_until(
        lambda: b"after" in consumer.handled,
        timeout=60,
        what=f"the message behind the {poison} one handled",
    )
    assert consumer.handled == [b"before", b"after"]
    assert consumer.reconnects >= LIMIT, "the poison was delivered fewer times than the limit"
    assert await depth(connection, consumer.queue) == 0
    await wait_until(dead_lettered(connection, consumer, 1), what="the poison dead-lettered")
    # Nothing of it reached the parking queue, whose tools must decode what they read.
    assert await depth(connection, f"{consumer.queue}.parking") == 0


async def test_messages_delivered_with_the_poison_are_not_lost(
    start_consumer: Callable[..., Any], connection: AbstractRobustConnection
) -> None:
    # With a prefetch window, messages behind the poison may be on their way when the
    # connection drops: returned with it, they count deliveries too. Each ends handled or
    # (if it reached the limit with the poison) dead-lettered beside it, never lost.
    consumer = await start_consumer(prefetch=20)
    await consumer.publish(b"poison", **POISONS["timestamp-property"])
    behind = [b"behind-%d" % n for n in range(10)]
    for body in behind:
        await consumer.publish(body)

    async def settled() -> bool:
        return len(consumer.handled) + await depth(connection, consumer.dead_letter) == 11

    await wait_until(settled, timeout=60, what="the poison dead-lettered, the rest settled")
    assert set(consumer.handled) <= set(behind)
    assert len(set(consumer.handled)) == len(consumer.handled), "a message handled twice"
    assert await depth(connection, consumer.queue) == 0
    underlay = await consumer.publisher.get_underlay_channel()
    version = underlay.connection.server_properties.get("version")
    print(
        f"COUNTS behind the poison (RabbitMQ {version!r}): handled {len(consumer.handled)} "
        f"of {len(behind)}, the rest dead-lettered with it"
    )


async def test_past_the_limit_the_broker_keeps_a_record_parking_reads(
    start_consumer: Callable[..., Any], connection: AbstractRobustConnection
) -> None:
    # The record of a message moved aside by the delivery limit is the broker's x-death
    # entry. An undecodable message cannot be read here, so a decodable one goes the same
    # way: taken and returned unacked (a lost connection), once more than the limit allows.
    consumer = await start_consumer()
    await consumer.channel.close()
    await consumer.publish(b"returned", message_id="returned")
    for _ in range(LIMIT + 1):
        channel = await connection.channel()
        taken = await (await channel.get_queue(consumer.queue)).get(timeout=10)
        assert taken.body == b"returned"
        await channel.close()  # returned unacked: one delivery counted
    await wait_until(dead_lettered(connection, consumer, 1), what="the message moved aside")
    channel = await connection.channel()
    moved = await (await channel.get_queue(consumer.dead_letter)).get(timeout=10)
    await moved.ack()
    deaths = moved.headers["x-death"]
    assert isinstance(deaths, list) and isinstance(deaths[0], dict)
    assert deaths[0]["reason"] == "delivery_limit"
    assert deaths[0]["queue"] == consumer.queue
    # As `delayed-retry parking list --parking-queue Q.dead-letter` reads it.
    record = read_record(moved.headers, message_id=moved.message_id, body=moved.body)
    assert record.reason == "delivery-limit"
    assert record.queue == consumer.queue
    assert consumer.handled == []


async def test_a_command_that_reads_one_says_what_it_is_and_where_to_look(
    start_consumer: Callable[..., Any],
    connection: AbstractRobustConnection,
    rabbitmq_url: str,
    unique: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    consumer = await start_consumer()
    await consumer.publish(b"poison", **POISONS["timestamp-property"])
    await wait_until(dead_lettered(connection, consumer, 1), timeout=60, what="the poison moved")
    capsys.readouterr()
    command = ["--url", rabbitmq_url, "parking", "list", "--queue", consumer.queue]
    command += ["--parking-queue", consumer.dead_letter, "--prefix", unique, "--levels", "8"]
    assert await asyncio.to_thread(main, command) == 1
    err = capsys.readouterr().err
    assert "cannot be decoded by the AMQP client" in err and "year" in err
    assert "Messages the client cannot decode" in err
    assert await depth(connection, consumer.dead_letter) == 1, "the command removed it"


async def test_consume_declares_the_dead_letter_queue_the_arguments_name(
    connection: AbstractRobustConnection, unique: str
) -> None:
    topology = DelayTopology(prefix=unique, levels=4)
    queue, target = f"{unique}.work", f"{unique}.elsewhere"
    channel = await connection.channel()
    try:
        arguments = work_queue_arguments(queue, dead_letter_queue=target)
        declared = await channel.declare_queue(queue, durable=True, arguments=arguments)

        @with_delayed_retry(topology=topology)
        async def handle(message: AbstractIncomingMessage) -> None:
            pass

        await consume(declared, handle)
        assert await depth(connection, target) == 0  # exists (a missing queue raises)
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await (await connection.channel()).declare_queue(f"{queue}.dead-letter", passive=True)
    finally:
        await delete_all(connection, queues=[queue, target], topology=topology)
