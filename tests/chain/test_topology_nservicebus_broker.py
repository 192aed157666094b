"""DelayTopology.nservicebus(): NServiceBus.RabbitMQ's v2 delay infrastructure, shared.

The expectations below are written from NServiceBus.RabbitMQ's
``DelayInfrastructure`` (7.0+) as its documentation describes it: 28 levels
``nsb.v2.delay-level-NN`` (two digits), each a topic exchange and a quorum queue
with TTL 2^N s, at-least-once dead-lettering into the next lower level (level 0
into ``nsb.v2.delay-delivery``); queue binding ``*.`` × (27 − N) ``1.#``;
exchange-to-exchange binding ``*.`` × (27 − N) ``0.#``; routing key: the delay
in seconds as 28 binary digit words, highest first, then the address; a
message enters at the level of its highest set bit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import aio_pika
import aiormq
import pytest
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from pamqp import commands

from delayed_retry import ConfigurationError, DelayTopology, publish_delayed
from delayed_retry.admin.chain_migration import migrate_chain
from delayed_retry.admin.other_chains import SourceChain
from delayed_retry.amqp.channels import exchange_exists
from delayed_retry.amqp.declarer import declare_topology
from delayed_retry.chain.digest import markable, markers
from delayed_retry.chain.topology import amqp_arguments
from delayed_retry.headers import X_DUE_AT, read_epoch_ms
from harness import RabbitMQNode
from tests.support.amqp_proxy import FrameCountingProxy
from tests.support.waiting import WAIT

NSB = DelayTopology.nservicebus(prefix="p")


def nsb_routing_key(delay_seconds: int, address: str) -> str:
    """NServiceBus's CalculateRoutingKey, as documented: 28 digit words, then the address."""
    return "".join(f"{(delay_seconds >> level) & 1}." for level in range(27, -1, -1)) + address


def nsb_starting_level(delay_seconds: int) -> int:
    return max(delay_seconds.bit_length() - 1, 0)


def test_names_and_route_are_nservicebus_v2() -> None:
    assert NSB.level_name(0) == "nsb.v2.delay-level-00"
    assert NSB.level_name(27) == "nsb.v2.delay-level-27"
    assert NSB.delivery_exchange == "nsb.v2.delay-delivery"
    assert NSB.max_delay == timedelta(seconds=(1 << 28) - 1)
    for seconds in (1, 5, 90, 3600, 86_400 * 30, (1 << 28) - 1):
        route = NSB.route(seconds, "Sales")
        assert route.routing_key == nsb_routing_key(seconds, "Sales")
        assert route.exchange == f"nsb.v2.delay-level-{nsb_starting_level(seconds):02d}"
    assert NSB.route(5, "Sales").routing_key == "0." * 25 + "1.0.1.Sales"
    assert NSB.is_chain_exchange("nsb.v2.delay-level-13")
    assert not NSB.is_chain_exchange("p.level.13")


def test_declarations_equal_what_nservicebus_declares() -> None:
    queues = {q.name: q for q in NSB.queues()}
    for level in range(28):
        name = f"nsb.v2.delay-level-{level:02d}"
        assert amqp_arguments(queues[name].arguments) == {
            "x-queue-type": "quorum",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-message-ttl": (1 << level) * 1000,
            "x-dead-letter-exchange": (
                f"nsb.v2.delay-level-{level - 1:02d}" if level else "nsb.v2.delay-delivery"
            ),
        }
        assert queues[name].bindings == ((name, "*." * (27 - level) + "1.#"),)
    exchange_bindings = set(NSB.exchange_bindings())
    for level in range(28):
        lower = f"nsb.v2.delay-level-{level - 1:02d}" if level else "nsb.v2.delay-delivery"
        assert (lower, f"nsb.v2.delay-level-{level:02d}", "*." * (27 - level) + "0.#") in (
            exchange_bindings
        )
    exchanges = {e.name: e for e in NSB.exchanges()}
    for name in [*(f"nsb.v2.delay-level-{n:02d}" for n in range(28)), "nsb.v2.delay-delivery"]:
        assert exchanges[name].type == "topic"
        assert exchanges[name].alternate_exchange is None  # as NServiceBus declares them
    # Ours keep the prefix.
    assert {"p.parking", "p.unroutable", "p.rejected"} <= set(exchanges)


def test_other_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="28 levels of 1 s on quorum"):
        DelayTopology(naming="nservicebus-v2")
    with pytest.raises(ConfigurationError, match="naming="):
        DelayTopology(naming="celery")  # type: ignore[arg-type]


async def _declare_like_nservicebus(channel: AbstractChannel) -> None:
    """NServiceBus's DelayInfrastructure.Build, spelled with aio-pika."""
    key = "1.#"
    for level in range(27, -1, -1):
        name = f"nsb.v2.delay-level-{level:02d}"
        exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(
            name,
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
                "x-message-ttl": (1 << level) * 1000,
                "x-dead-letter-exchange": (
                    f"nsb.v2.delay-level-{level - 1:02d}" if level else "nsb.v2.delay-delivery"
                ),
            },
        )
        await queue.bind(exchange, routing_key=key)
        key = "*." + key
    key = "0.#"
    for level in range(27, 0, -1):
        lower = await channel.get_exchange(f"nsb.v2.delay-level-{level - 1:02d}")
        await lower.bind(f"nsb.v2.delay-level-{level:02d}", routing_key=key)
        key = "*." + key
    delivery = await channel.declare_exchange(
        "nsb.v2.delay-delivery", aio_pika.ExchangeType.TOPIC, durable=True
    )
    await delivery.bind("nsb.v2.delay-level-00", routing_key=key)


@pytest.fixture(scope="module")
def nsb_node() -> Iterator[RabbitMQNode]:
    """A private node for this module: the nsb.v2 names are fixed, so never a shared broker."""
    with RabbitMQNode() as node:
        yield node


@pytest.fixture
async def private_broker(nsb_node: RabbitMQNode) -> AsyncIterator[AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(nsb_node.url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.mark.broker
async def test_python_and_nservicebus_share_one_chain(
    private_broker: AbstractRobustConnection,
) -> None:
    channel = await private_broker.channel()
    await _declare_like_nservicebus(channel)
    # An NServiceBus endpoint (conventional routing): an exchange named for it, bound
    # to the delivery exchange with #.<address>, and its queue.
    sales_ex = await channel.declare_exchange("Sales", aio_pika.ExchangeType.FANOUT, durable=True)
    sales = await channel.declare_queue("Sales", durable=True)
    await sales.bind(sales_ex)
    await sales_ex.bind("nsb.v2.delay-delivery", routing_key="#.Sales")
    orders = await channel.declare_queue("orders", durable=True)

    # Declaring our NServiceBus-named chain over theirs is accepted: same arguments.
    await declare_topology(channel, NSB, queues=["orders"])

    # A Python service schedules for its own queue, NServiceBus for its endpoint.
    await publish_delayed(channel, aio_pika.Message(b"py"), queue="orders", delay=1, topology=NSB)
    level = await channel.get_exchange(f"nsb.v2.delay-level-{nsb_starting_level(1):02d}")
    await level.publish(aio_pika.Message(b"for-dotnet"), routing_key=nsb_routing_key(1, "Sales"))
    assert (await asyncio.wait_for(_next(orders), WAIT)).body == b"py"
    assert (await asyncio.wait_for(_next(sales), WAIT)).body == b"for-dotnet"

    # Our own naming under the same names is refused by the broker, not silently mixed.
    bad = await private_broker.channel()
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="alternate-exchange"):
        await bad.declare_exchange(
            "nsb.v2.delay-level-00",
            aio_pika.ExchangeType.TOPIC,
            durable=True,
            arguments={"alternate-exchange": "p.unroutable"},
        )


async def _next(queue: AbstractQueue) -> AbstractIncomingMessage:
    """The next message of ``queue``, consumed and acked, within WAIT seconds."""
    async with queue.iterator() as messages:
        async for message in messages:
            await message.ack()
            return message
    raise AssertionError(f"queue {queue.name!r} was closed")


@pytest.mark.broker
async def test_migrate_out_of_the_nservicebus_chain(
    private_broker: AbstractRobustConnection,
) -> None:
    channel = await private_broker.channel()
    await _declare_like_nservicebus(channel)
    sales = await channel.declare_queue("Sales", durable=True)
    level = await channel.get_exchange("nsb.v2.delay-level-11")
    await level.publish(aio_pika.Message(b"later"), routing_key=nsb_routing_key(3600, "Sales"))
    await level.publish(aio_pika.Message(b"lost?"), routing_key=nsb_routing_key(3600, "Gone"))
    target = DelayTopology(prefix="ours", levels=24, queue_type="classic")

    started = datetime.now(UTC)
    report = await migrate_chain(private_broker, source=SourceChain.nservicebus(), target=target)
    assert (report.moved, report.left) == (1, 1)
    assert "destination 'Gone' unusable" in next(iter(report.levels[11].problems))

    moved = await (await channel.get_queue(target.level_name(21))).get(timeout=WAIT)
    assert moved is not None and moved.body == b"later"
    due = read_epoch_ms((moved.headers or {})[X_DUE_AT])
    # No record in an NServiceBus message: the latest it could be due, 2048 s + 1552 s.
    assert due is not None
    assert started + timedelta(seconds=3600) <= due <= datetime.now(UTC) + timedelta(seconds=3601)
    assert (await sales.declare()).message_count == 0


def test_an_nservicebus_chain_is_never_marked_complete() -> None:
    # Its exchanges have no alternate exchange: a binding removed by hand would hold a message
    # in its level, so every connection declares the chain, which puts the binding back.
    assert not markable(NSB)
    assert markable(DelayTopology(prefix="p"))


@pytest.mark.broker
async def test_each_connection_declares_an_nservicebus_chain_in_full(
    private_broker: AbstractRobustConnection, nsb_node: RabbitMQNode
) -> None:
    channel = await private_broker.channel()
    await declare_topology(channel, NSB)
    for marker in markers(NSB):
        assert not await exchange_exists(private_broker, marker), marker
    proxy = FrameCountingProxy("127.0.0.1", nsb_node.amqp_port)
    await proxy.start()
    try:
        async with await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{proxy.port}/") as other:
            await declare_topology(await other.channel(), NSB)
        sent = proxy.connections[0]
        binds = sent.of(commands.Exchange.Bind) + sent.of(commands.Queue.Bind)
        assert len(binds) >= NSB.levels, "a connection skipped declaring an unmarkable chain"
    finally:
        await proxy.close()
