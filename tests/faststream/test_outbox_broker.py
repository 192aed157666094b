"""DelayedRetry(outbox=True) on a real broker: the decorator's outbox under FastStream."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange
from tenacity import wait_fixed

from delayed_retry import current_outbox
from delayed_retry.faststream import CurrentRetryState
from tests.consumer.test_outbox_broker import SHORT_WINDOW
from tests.faststream.test_acks_broker import _left_in
from tests.faststream.test_middleware_broker import queue_of, retrier, running
from tests.support.chain import Scenario
from tests.support.queues import drain
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


@pytest.mark.parametrize(("outbox", "downstream"), [(True, 2), (False, 6)])
async def test_a_subscriber_failing_twice_publishes_two_messages_once_with_the_outbox(
    quorum: Scenario, rabbitmq_url: str, outbox: bool, downstream: int
) -> None:
    retry = retrier(quorum, max_retries=3, wait=wait_fixed(0.1), outbox=outbox)
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retry])
    work, down = queue_of(quorum, "work"), queue_of(quorum, "down")
    succeeded = asyncio.Event()

    @broker.subscriber(work)
    async def handle(body: str, state: CurrentRetryState) -> None:
        for n in (1, 2):
            follow_up = f"follow-up {n}".encode()
            if outbox:
                current_outbox().publish(follow_up, routing_key=down.name)
            else:
                await broker.publish(follow_up, down.name)
        if state.attempt <= 2:
            raise ConnectionError(f"fails on attempt {state.attempt}")
        succeeded.set()

    async with running(broker):
        await broker.declare_queue(down)
        await broker.publish("job", work.name, message_id="in-1")
        await asyncio.wait_for(succeeded.wait(), 15)
        await quorum.wait_for_depth(down.name, downstream)
    assert await _left_in(rabbitmq_url, work.name) == 0
    arrived = await drain(quorum.connection, down.name)
    assert len(arrived) == downstream
    if outbox:
        assert [m.message_id for m in arrived] == ["in-1:outbox:1", "in-1:outbox:2"]


async def test_held_publishes_are_dropped_when_the_message_parks(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    broker = RabbitBroker(
        rabbitmq_url, logger=None, middlewares=[retrier(quorum, max_retries=1, outbox=True)]
    )
    work, down = queue_of(quorum, "work"), queue_of(quorum, "down")
    parking = quorum.topology.default_parking_queue(work.name)

    @broker.subscriber(work)
    async def handle(body: str) -> None:
        current_outbox().publish(b"follow-up", routing_key=down.name)
        raise ValueError("always fails")

    async with running(broker):
        await broker.declare_queue(down)
        await broker.publish("job", work.name, message_id="in-2")
        await quorum.wait_for_depth(parking, 1)
    assert await quorum.depth(down.name) == 0


async def test_a_refused_held_publish_gives_the_message_back_unacked(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    retry = retrier(quorum, outbox=True)
    retry.options = replace(retry.options, timing=SHORT_WINDOW)
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retry])
    work = queue_of(quorum, "work")
    exchange = RabbitExchange(quorum.name("x"), type=ExchangeType.DIRECT)
    quorum.track_exchange(exchange.name)
    runs: list[int] = []

    @broker.subscriber(work)
    async def handle(body: str) -> None:
        runs.append(1)
        current_outbox().publish(
            b"follow-up", exchange=exchange.name, routing_key="k", mandatory=True
        )

    async with running(broker):
        await broker.declare_exchange(exchange)
        await broker.publish("job", work.name, message_id="in-5")
        # Unroutable: given back after the window and handled again, never acked or parked.
        await wait_until(lambda: len(runs) >= 2, what="the message handled again")
    assert await _left_in(rabbitmq_url, work.name) == 1
    assert await quorum.depth(quorum.topology.default_parking_queue(work.name)) == 0
