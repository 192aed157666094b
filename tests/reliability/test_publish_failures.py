"""A hand-over the broker nacks, or whose confirm never comes: the original stays unacked.

The nack is real: a policy gives the chain's level queues ``max-length 0``
with ``reject-publish`` overflow, and the broker nacks every publish into
them. The timeout is real too: a memory alarm blocks the consumer's connection.
While the hand-over fails the original is neither acked nor requeued (it is
held, and the publish tried again with backoff), the consumer goes on, and once
the broker accepts the copy the message comes back through the chain.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from delayed_retry import DelayTopology, consume, current_retry_state, with_delayed_retry
from harness import RabbitMQNode
from tests.support.waiting import wait_until

from ._support import QUORUM, Ledger, body_id


@pytest.fixture
async def channel(running_node: RabbitMQNode) -> AsyncIterator[AbstractChannel]:
    connection = await aio_pika.connect_robust(running_node.url)
    try:
        yield await connection.channel()
    finally:
        await connection.close()


def not_confirmed(caplog: pytest.LogCaptureFixture) -> int:
    return sum("was not confirmed" in r.getMessage() for r in caplog.records)


def unacked(node: RabbitMQNode, queue: str) -> int:
    out = node.rabbitmqctl("list_queues", "name", "messages_unacknowledged", "--formatter", "json")
    rows = {row["name"]: row for row in json.loads(out)}
    return int(rows[queue]["messages_unacknowledged"])


async def test_nacked_hand_over_keeps_the_original_unacked_and_the_consumer_running(
    running_node: RabbitMQNode,
    channel: AbstractChannel,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="delayed_retry.consumer.handover")
    node = running_node
    queue = f"{unique}.work"
    # Classic level queues reject a publish at once when full; a quorum queue accepts
    # one message past its limit first, so it cannot be made to nack every publish.
    topology = DelayTopology(prefix=unique, levels=12, queue_type="classic")
    ledger = Ledger(sent={1, 2})
    attempts: Counter[int] = Counter()

    # hold=None: the retry enters the chain's levels (held, a 0.2 s retry would not).
    @with_delayed_retry(max_retries=3, wait=tenacity.wait_fixed(0.2), topology=topology, hold=None)
    async def handle(message: AbstractIncomingMessage) -> None:
        i = body_id(message)
        attempts[i] += 1
        state = current_retry_state()
        assert state is not None
        if i == 1 and state.attempt == 1:
            raise RuntimeError("first attempt of message 1 fails")
        ledger.handled[i] += 1

    q = await channel.declare_queue(queue, durable=True, arguments=QUORUM)
    await consume(q, handle)
    policy = f"{unique}-full"
    node.rabbitmqctl(
        "set_policy",
        "--apply-to",
        "queues",
        policy,
        rf"^{unique}\.level\.",
        '{"max-length":0,"overflow":"reject-publish"}',
    )
    try:
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"id": 1}', message_id="1"), routing_key=queue
        )
        await wait_until(
            lambda: not_confirmed(caplog) >= 2,
            timeout=30,
            what="two nacked hand-overs",
        )
        # Held, not requeued: handled once so far, and unacked on the broker.
        assert attempts[1] == 1
        await wait_until(
            lambda: unacked(node, queue) == 1, timeout=15, what="the broker to list 1 unacked"
        )
        # The consumer goes on with other messages meanwhile.
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"id": 2}', message_id="2"), routing_key=queue
        )
        await wait_until(lambda: ledger.handled[2] == 1, timeout=30, what="message 2 handled")
        assert attempts[1] == 1
    finally:
        node.rabbitmqctl("clear_policy", policy)
    await wait_until(
        lambda: ledger.handled[1] >= 1, timeout=40, what="message 1 back through the chain"
    )
    assert attempts[1] == 2
    assert ledger.report("publish-nacked")["lost"] == 0
    await channel.queue_delete(queue, if_unused=False, if_empty=False)


async def test_hand_over_that_times_out_keeps_the_original_until_the_broker_accepts(
    running_node: RabbitMQNode,
    channel: AbstractChannel,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="delayed_retry.consumer.handover")
    node = running_node
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=12)
    ledger = Ledger(sent={1, 2})
    entered = asyncio.Event()
    alarm_on = asyncio.Event()

    # hold=None: the retry enters the chain's levels (held, a 0.2 s retry would not).
    @with_delayed_retry(
        max_retries=3,
        wait=tenacity.wait_fixed(0.2),
        topology=topology,
        publish_timeout=1,
        hold=None,
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        i = body_id(message)
        state = current_retry_state()
        assert state is not None
        if i == 1 and state.attempt == 1:
            entered.set()
            await alarm_on.wait()
            raise RuntimeError("first attempt of message 1 fails while the broker is blocked")
        ledger.handled[i] += 1

    q = await channel.declare_queue(queue, durable=True, arguments=QUORUM)
    await consume(q, handle)
    await channel.default_exchange.publish(
        aio_pika.Message(b'{"id": 1}', message_id="1"), routing_key=queue
    )
    await asyncio.wait_for(entered.wait(), 30)
    # A memory alarm blocks every publishing connection: the confirm cannot come.
    await asyncio.to_thread(node.rabbitmqctl, "set_vm_memory_high_watermark", "0")
    try:
        alarm_on.set()
        await wait_until(
            lambda: not_confirmed(caplog) >= 2, timeout=30, what="two timed-out hand-overs"
        )
        assert ledger.handled[1] == 0
    finally:
        await asyncio.to_thread(node.rabbitmqctl, "set_vm_memory_high_watermark", "0.4")
    await wait_until(
        lambda: ledger.handled[1] >= 1, timeout=60, what="message 1 back through the chain"
    )
    # The consumer survived the blocked connection and goes on.
    await channel.default_exchange.publish(
        aio_pika.Message(b'{"id": 2}', message_id="2"), routing_key=queue
    )
    await wait_until(lambda: ledger.handled[2] == 1, timeout=30, what="message 2 handled")
    assert ledger.report("publish-timed-out")["lost"] == 0
    await channel.queue_delete(queue, if_unused=False, if_empty=False)
