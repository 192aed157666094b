"""The outbox on a real broker: held publishes leave once, after the handler succeeds."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from delayed_retry import (
    Outbox,
    RetryingHandler,
    consume,
    current_outbox,
    current_retry_state,
    with_delayed_retry,
)
from delayed_retry import headers as h
from delayed_retry.consumer.handover import HandOverTiming
from tests.support.chain import Scenario, publish
from tests.support.queues import drain
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

FAST = tenacity.wait_fixed(0.1)
SHORT_WINDOW = HandOverTiming(window=0.5, first_pause=0.1, max_pause=0.2, requeue_first_pause=0.1)
"""The hand-over's 30 s window cut short: the test is about what follows it."""


async def consuming(scenario: Scenario, handler: RetryingHandler[...]) -> AbstractChannel:
    """A channel of its own consuming ``<unique>.work`` with ``handler``; close it to stop."""
    channel = await scenario.connection.channel()
    queue = await scenario.queue("work", channel=channel)
    await consume(queue, handler)
    return channel


@pytest.mark.parametrize(("outbox", "downstream"), [(True, 2), (False, 6)])
async def test_a_handler_failing_twice_publishes_two_messages_once_with_the_outbox(
    quorum: Scenario, outbox: bool, downstream: int
) -> None:
    down = await quorum.queue("down")
    succeeded = asyncio.Event()

    @with_delayed_retry(max_retries=3, wait=FAST, topology=quorum.topology, outbox=outbox)
    async def handler(message: AbstractIncomingMessage) -> None:
        for n in (1, 2):
            body = f"follow-up {n}".encode()
            if outbox:
                current_outbox().publish(body, routing_key=down.name)
            else:
                await quorum.ch.default_exchange.publish(aio_pika.Message(body), down.name)
        state = current_retry_state()
        assert state is not None
        if state.attempt <= 2:
            raise ConnectionError(f"fails on attempt {state.attempt}")
        succeeded.set()

    channel = await consuming(quorum, handler)
    await publish(quorum.ch, quorum.name("work"), b"job", message_id="in-1")
    await asyncio.wait_for(succeeded.wait(), 15)
    await quorum.wait_for_depth(down.name, downstream)
    await channel.close()  # an unacked delivery would come back to the work queue now
    assert await quorum.depth(quorum.name("work")) == 0
    arrived = await drain(quorum.connection, down.name)
    assert len(arrived) == downstream
    if outbox:
        assert [m.message_id for m in arrived] == ["in-1:outbox:1", "in-1:outbox:2"]
        assert [m.body for m in arrived] == [b"follow-up 1", b"follow-up 2"]


async def test_held_publishes_are_dropped_when_the_message_parks(quorum: Scenario) -> None:
    down = await quorum.queue("down")

    @with_delayed_retry(max_retries=1, wait=FAST, topology=quorum.topology, outbox=True)
    async def handler(message: AbstractIncomingMessage) -> None:
        current_outbox().publish(b"follow-up", routing_key=down.name)
        raise ValueError("always fails")

    channel = await consuming(quorum, handler)
    await publish(quorum.ch, quorum.name("work"), b"job", message_id="in-2")
    parking = quorum.topology.default_parking_queue(quorum.name("work"))
    await quorum.wait_for_depth(parking, 1)
    await channel.close()
    (record,) = await drain(quorum.connection, parking)
    assert record.headers[h.X_PARKED_REASON] == "max-retries"
    assert await quorum.depth(down.name) == 0


async def test_a_held_publish_refused_keeps_the_incoming_message_until_it_is_confirmed(
    quorum: Scenario,
) -> None:
    """Unroutable (mandatory): not confirmed, so the message goes back, then succeeds."""
    exchange = await quorum.ch.declare_exchange(quorum.name("x"), aio_pika.ExchangeType.DIRECT)
    quorum.track_exchange(exchange.name)
    runs: list[str | None] = []

    @with_delayed_retry(topology=quorum.topology, outbox=True)
    async def handler(message: AbstractIncomingMessage) -> None:
        runs.append(message.message_id)
        current_outbox().publish(
            b"follow-up", exchange=exchange.name, routing_key="k", mandatory=True
        )

    quick = RetryingHandler(handler.fn, replace(handler.options, timing=SHORT_WINDOW))
    channel = await consuming(quorum, quick)
    await publish(quorum.ch, quorum.name("work"), b"job", message_id="in-3")
    # Given back after its window and delivered again: kept, not acked, not parked.
    await wait_until(lambda: len(runs) >= 2, what="the message handled again after a give-back")
    down = await quorum.queue("down")
    await down.bind(exchange, "k")
    await quorum.wait_for_depth(down.name, 1)
    await channel.close()
    assert await quorum.depth(quorum.name("work")) == 0
    assert await quorum.depth(quorum.topology.default_parking_queue(quorum.name("work"))) == 0
    (arrived,) = await drain(quorum.connection, down.name)
    assert arrived.message_id == "in-3:outbox:1"
    assert set(runs) == {"in-3"}


async def test_an_event_nobody_receives_yet_does_not_hold_back_the_delivery(
    quorum: Scenario,
) -> None:
    # Not mandatory (the default): an exchange with no binding confirms and drops the event,
    # and the incoming message is acked once; a missing exchange closes only the outbox's
    # own channel, so the consumer's channel and its other deliveries are untouched.
    exchange = await quorum.ch.declare_exchange(quorum.name("x"), aio_pika.ExchangeType.DIRECT)
    quorum.track_exchange(exchange.name)
    runs: list[str | None] = []
    outboxes: list[Outbox] = []

    @with_delayed_retry(topology=quorum.topology, outbox=True)
    async def handler(message: AbstractIncomingMessage) -> None:
        runs.append(message.message_id)
        outboxes.append(current_outbox())
        current_outbox().publish(b"event", exchange=exchange.name, routing_key="nobody")

    channel = await consuming(quorum, handler)
    await publish(quorum.ch, quorum.name("work"), b"job", message_id="in-9")
    # Released: the event confirmed and the delivery acked after it.
    await wait_until(lambda: bool(outboxes) and outboxes[0].released, what="the outbox released")
    assert runs == ["in-9"] and not channel.is_closed
    await channel.close()


async def test_an_immediate_retry_starts_with_an_empty_outbox(quorum: Scenario) -> None:
    down = await quorum.queue("down")
    runs: list[int] = []

    @with_delayed_retry(topology=quorum.topology, outbox=True, immediate_retries=2)
    async def handler(message: AbstractIncomingMessage) -> None:
        runs.append(len(current_outbox().held))
        current_outbox().publish(f"run {len(runs)}".encode(), routing_key=down.name)
        if len(runs) <= 2:
            raise ConnectionError("a glitch")

    channel = await consuming(quorum, handler)
    await publish(quorum.ch, quorum.name("work"), b"job", message_id="in-4")
    await quorum.wait_for_depth(down.name, 1)
    await channel.close()
    assert runs == [0, 0, 0]
    (arrived,) = await drain(quorum.connection, down.name)
    assert (arrived.body, arrived.message_id) == (b"run 3", "in-4:outbox:1")


async def test_a_handler_that_acks_itself_still_gets_its_held_messages_published(
    quorum: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    down = await quorum.queue("down")

    @with_delayed_retry(topology=quorum.topology, outbox=True)
    async def handler(message: AbstractIncomingMessage) -> None:
        current_outbox().publish(b"follow-up", routing_key=down.name)
        await message.ack()

    channel = await consuming(quorum, handler)
    await publish(quorum.ch, quorum.name("work"), b"job", message_id="in-6")
    await quorum.wait_for_depth(down.name, 1)
    await channel.close()
    assert await quorum.depth(quorum.name("work")) == 0
    assert "acked message in-6 itself, with outbox=True" in caplog.text
    assert "could not be acked" not in caplog.text
