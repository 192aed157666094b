"""Held delays on a real broker: out of the chain a little early, handled at the due time."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import (
    DEFAULT_HOLD,
    current_retry_state,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.delivery.forwarder import Forwarder
from tests.consumer.test_decorator_broker import Calls, start
from tests.support.chain import Inbox, Scenario
from tests.support.waiting import WAIT, wait_until

pytestmark = pytest.mark.broker


async def test_a_held_retry_is_handled_at_its_due_time_never_before(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry(wait=tenacity.wait_fixed(0.7), topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        if calls.record(message).attempt == 1:
            raise ConnectionError("down")

    queue, _ = await start(quorum, handler)
    await quorum.ch.default_exchange.publish(aio_pika.Message(b"m"), queue.name)
    failed_at, _, _, _ = await calls.get()
    handled_at, state, _, _ = await calls.get()
    assert state.attempt == 2
    assert state.due_at is not None
    assert handled_at >= state.due_at.timestamp(), "handled before its due time"
    assert state.due_at.timestamp() - failed_at >= 0.7


async def test_scheduled_messages_held_by_the_handler_arrive_at_their_due_times(
    quorum: Scenario,
) -> None:
    due: dict[str, float] = {}
    arrived: dict[str, float] = {}
    all_in = asyncio.Event()

    @with_delayed_retry(topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        arrived[message.message_id or ""] = time.time()
        state = current_retry_state()
        assert state is not None
        if len(arrived) == len(due):
            all_in.set()

    queue, _ = await start(quorum, handler)
    now = datetime.now(UTC)
    for i, ms in enumerate((0, 15, 90, 260, 700, 1100)):
        at = now + timedelta(milliseconds=ms)
        due[str(i)] = at.timestamp()
        await publish_delayed(
            quorum.ch,
            aio_pika.Message(b"s", message_id=str(i)),
            queue=queue.name,
            delay=at,
            topology=quorum.topology,
            hold=DEFAULT_HOLD,
            now=now,
        )
    await asyncio.wait_for(all_in.wait(), WAIT)
    early = {k: due[k] - arrived[k] for k in due if arrived[k] < due[k]}
    assert early == {}, f"handled before due (seconds early): {early}"


async def test_a_held_delay_to_an_exchange_is_forwarded_at_its_due_time(
    quorum: Scenario,
) -> None:
    s = quorum
    exchange = s.name("x")
    s.track_exchange(exchange)
    await s.ch.declare_exchange(exchange, "topic", durable=True)
    forward = s.topology.forward_queue(exchange)
    s.track_queue(forward, f"{forward}.parking")
    queue = await s.queue()
    await queue.bind(exchange, routing_key="k")
    inbox = Inbox()
    await queue.consume(inbox)
    async with Forwarder(s.connection, exchanges=[exchange], topology=s.topology) as fwd:
        dues = []
        for delay in (0.02, 0.3, 0.9):
            dues.append(
                await publish_delayed(
                    s.ch,
                    aio_pika.Message(b"x"),
                    exchange=exchange,
                    routing_key="k",
                    delay=delay,
                    topology=s.topology,
                    hold=DEFAULT_HOLD,
                )
            )
        arrivals = [await inbox.get() for _ in dues]
        # The forwarder counts a message after its ack, which may follow the delivery.
        await wait_until(lambda: fwd.forwarded == 3, what="three forwards counted")
    for due, arrival in zip(dues, sorted(arrivals, key=lambda a: a.at), strict=True):
        assert arrival.at >= due.timestamp(), "forwarded before its due time"
