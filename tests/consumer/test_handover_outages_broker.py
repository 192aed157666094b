"""The one hand-over under broker trouble: each consumer the library runs keeps the message.

Each case is what an operator saw lose messages on RabbitMQ 4.0 (a quorum queue
with the default delivery limit of 20 drops a message on its 21st return) and
spin on 3.10: a consumer that gave a message back at once whenever it could not
hand it on. Here the front door, the forwarder and the router meet the same
faults and must deliver every message, give it back at most once per hand-over
window, and leave nothing parked that should not be.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from tenacity import wait_fixed

from delayed_retry import (
    NoInstrumentation,
    RetryRouter,
    consume,
    current_retry_state,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.admin.chain_probe import exchange_exists
from delayed_retry.chain.topology import DELIVERY_LIMIT
from delayed_retry.delivery.forwarder import Forwarder
from delayed_retry.delivery.front_door import FrontDoor
from delayed_retry.headers import X_DELAY, X_PARKED_REASON
from tests.support.chain import Inbox, Scenario, open_scenario
from tests.support.waiting import WAIT, wait_until

pytestmark = pytest.mark.broker

REFUSAL_SECONDS = 25.0
"""How long the forwarder's target refuses publishes: longer than 21 returns at the old
one-second pause, so a forwarder that gives back on each failure loses the message on
RabbitMQ 4.0-4.2."""


@pytest.fixture
async def chain(
    connection: AbstractRobustConnection, unique: str, rabbitmq_url: str
) -> AsyncIterator[Scenario]:
    async with open_scenario(connection, unique, rabbitmq_url, "quorum", levels=14) as opened:
        yield opened


async def _has_delivery_limit(s: Scenario, name: str) -> bool:
    """Whether ``name`` was declared with :data:`DELIVERY_LIMIT` (an equivalent declare passes)."""
    channel = await s.connection.channel()
    arguments = {"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT}
    try:
        await channel.declare_queue(name, durable=True, arguments=arguments)
        return True
    except aio_pika.exceptions.ChannelPreconditionFailed:
        return False
    finally:
        if not channel.is_closed:
            await channel.close()


async def _delete_level_exchanges(s: Scenario) -> None:
    channel = await s.connection.channel()
    try:
        for level in range(s.topology.levels):
            await channel.exchange_delete(s.topology.level_name(level))
    finally:
        await channel.close()


async def test_front_door_keeps_a_message_while_the_chain_exchanges_are_missing(
    chain: Scenario,
) -> None:
    s = chain
    exchange = s.name("plugin")
    forward = s.topology.forward_queue(exchange)
    s.track_queue(f"{exchange}.delay", f"{exchange}.delay.parking", forward, f"{forward}.parking")
    s.track_exchange(exchange, f"{exchange}.delay")
    async with FrontDoor(s.connection, exchange=exchange, topology=s.topology) as door:
        q = await s.queue()
        await q.bind(exchange, routing_key="orders.#")
        inbox = Inbox()
        await q.consume(inbox)
        # A mistaken teardown: every level exchange of the chain is gone.
        await _delete_level_exchanges(s)
        assert not await exchange_exists(s.connection, s.topology.level_name(0))
        sent = time.time()
        delay_exchange = await s.ch.get_exchange(door.delay_exchange, ensure=False)
        await delay_exchange.publish(
            aio_pika.Message(b"later", headers={X_DELAY: 2000}), routing_key="orders.a"
        )
        arrival = await inbox.get()
        assert arrival.message.body == b"later"
        assert arrival.at >= sent + 2.0, "delivered before its x-delay"
        assert arrival.headers[X_DELAY] == -2000
        # The front door put the chain back instead of returning the message 21 times.
        assert await exchange_exists(s.connection, s.topology.level_name(0))
        assert door.accepted == 1
        assert door.given_back == 0
        assert await s.depth(f"{exchange}.delay.parking") == 0
        assert await s.depth(f"{exchange}.delay") == 0


async def test_forwarder_keeps_a_message_while_its_exchange_refuses_publishes(
    chain: Scenario,
) -> None:
    s = chain
    exchange = s.name("x")
    s.track_exchange(exchange)
    x = await s.ch.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
    forward = s.topology.forward_queue(exchange)
    s.track_queue(forward, f"{forward}.parking")
    # A full consumer queue that refuses publishes, and a healthy one beside it.
    full = s.name("full")
    s.track_queue(full)
    full_queue = await s.ch.declare_queue(
        full,
        durable=True,
        arguments={"x-queue-type": "classic", "x-max-length": 0, "x-overflow": "reject-publish"},
    )
    await full_queue.bind(x, routing_key="k")
    healthy = await s.queue("healthy")
    await healthy.bind(x, routing_key="k")
    copies = Inbox()
    await healthy.consume(copies)

    async with Forwarder(s.connection, exchanges=[exchange], topology=s.topology) as fwd:
        await publish_delayed(
            s.ch,
            aio_pika.Message(b"m"),
            exchange=exchange,
            routing_key="k",
            delay=0.5,
            topology=s.topology,
        )
        first = await copies.get()  # the first forward reached the healthy queue, not the full one
        # The full queue refused it, so the forward was not confirmed: it is tried again.
        await wait_until(lambda: copies.pending() >= 1, what="a second forward")
        # The refusal lasts; the forwarder keeps the message unacked meanwhile.
        await asyncio.sleep(max(0.0, first.at + REFUSAL_SECONDS - time.time()))
        await full_queue.unbind(x, routing_key="k")
        await wait_until(lambda: fwd.forwarded == 1, timeout=WAIT + 10, what="the forward")
        tries = 1 + copies.pending()
        # Pauses of 0.5, 1, 2, 4, 8 s, then the message goes back once (30 s window) and
        # the next delivery starts again: about 11 tries in 25 s, where a forwarder that
        # gives back on each failure after 1 s makes 25 (and loses the message on 4.0).
        assert tries <= 13, f"{tries} forwards in {REFUSAL_SECONDS} s: the forwarder spins"
        assert fwd.parked == 0
        assert fwd.given_back <= 1
    await s.wait_for_depth(forward, 0)
    assert await s.depth(f"{forward}.parking") == 0


async def test_router_keeps_an_unroutable_message_while_its_exchange_is_missing(
    chain: Scenario,
) -> None:
    s = chain
    orders = s.name("orders")
    stranger = s.name("stranger")
    s.track_queue(orders, f"{orders}.parking", stranger)
    await s.ch.declare_queue(orders, durable=True, arguments={"x-queue-type": "quorum"})
    router = RetryRouter(queues=[orders], topology=s.topology, instrumentation=NoInstrumentation())
    await router.start(await s.connection.channel())
    channel = await s.connection.channel()
    await channel.exchange_delete(s.topology.unroutable_exchange)
    # A rejection from a queue the router was not started with: kept in <prefix>.unroutable.
    forged: dict[str, Any] = {"x-death": [{"queue": stranger, "reason": "rejected", "count": 1}]}
    rejected = await s.ch.get_exchange(s.topology.rejected_exchange, ensure=False)
    await rejected.publish(aio_pika.Message(b"r", headers=forged), routing_key="")
    await s.wait_for_depth(s.topology.unroutable_queue, 1)
    kept = await (await s.ch.get_queue(s.topology.unroutable_queue)).get(timeout=WAIT)
    assert kept is not None
    assert kept.body == b"r"
    assert (kept.headers or {})[X_PARKED_REASON] == "unknown-queue"
    await kept.ack()
    assert await exchange_exists(s.connection, s.topology.unroutable_exchange)
    await s.wait_for_depth(s.topology.rejected_queue, 0)


async def test_every_queue_the_library_consumes_has_the_delivery_limit(chain: Scenario) -> None:
    s = chain
    exchange = s.name("plugin")
    forward = s.topology.forward_queue(exchange)
    s.track_queue(f"{exchange}.delay", f"{exchange}.delay.parking", forward, f"{forward}.parking")
    s.track_exchange(exchange, f"{exchange}.delay")
    async with FrontDoor(s.connection, exchange=exchange, topology=s.topology):
        pass
    for name in (
        f"{exchange}.delay",
        forward,
        s.topology.rejected_queue,
        s.topology.unroutable_queue,
        f"{exchange}.delay.parking",
    ):
        assert await _has_delivery_limit(s, name), name


async def test_an_inbox_declared_without_the_limit_is_kept_with_a_warning(
    chain: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    s = chain
    exchange = s.name("plugin")
    forward = s.topology.forward_queue(exchange)
    s.track_queue(f"{exchange}.delay", f"{exchange}.delay.parking", forward, f"{forward}.parking")
    s.track_exchange(exchange, f"{exchange}.delay")
    # As an older version declared it: no delivery limit.
    await s.ch.declare_queue(
        f"{exchange}.delay", durable=True, arguments={"x-queue-type": "quorum"}
    )
    caplog.set_level(logging.WARNING, logger="delayed_retry.amqp.chain_declaration")
    async with FrontDoor(s.connection, exchange=exchange, topology=s.topology) as door:
        q = await s.queue()
        await q.bind(exchange, routing_key="#")
        inbox = Inbox()
        await q.consume(inbox)
        delay_exchange = await s.ch.get_exchange(door.delay_exchange, ensure=False)
        await delay_exchange.publish(aio_pika.Message(b"now"), routing_key="k")
        assert (await inbox.get()).message.body == b"now"
    warnings = [r.getMessage() for r in caplog.records if f"{exchange}.delay'" in r.getMessage()]
    assert warnings, "no warning named the inbox declared without a delivery limit"
    assert "x-delivery-limit" in warnings[0] and "delete" in warnings[0]


async def test_a_retrying_consumer_puts_a_deleted_chain_back_with_its_binding(
    chain: Scenario,
) -> None:
    s = chain
    q = await s.queue()
    attempts: list[int] = []
    done = asyncio.Event()

    @with_delayed_retry(
        topology=s.topology, wait=wait_fixed(0.3), instrumentation=NoInstrumentation()
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        state = current_retry_state()
        assert state is not None
        attempts.append(state.attempt)
        if state.attempt == 1:
            raise ConnectionError("the database is down")
        done.set()

    await consume(q, handler)
    # A mistaken teardown after the consumer started: every exchange of the chain is gone,
    # the delivery exchange (and with it the queue's binding) included.
    await _delete_level_exchanges(s)
    channel = await s.connection.channel()
    await channel.exchange_delete(s.topology.delivery_exchange)
    await channel.close()
    await s.ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key=q.name)
    await asyncio.wait_for(done.wait(), WAIT)
    # The refused publish closed the consumer's channel, so the broker may deliver the first
    # attempt again (at-least-once); then the chain is back, binding included, and the retry
    # comes through it once.
    assert attempts in ([1, 2], [1, 1, 2]), attempts
    assert await s.depth(s.topology.unroutable_queue) == 0
    assert await exchange_exists(s.connection, s.topology.delivery_exchange)
