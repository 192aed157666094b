"""A destination queue deleted while its messages wait in the delay chain.

When the messages come due, the delivery exchange has no binding for them;
its alternate exchange catches them into the topology's unroutable queue
(and a copy into the alerts queue), where they keep their retry record and
read as parked with reason ``unroutable``. Nothing is dropped.
"""

from __future__ import annotations

import json

import tenacity
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import DelayTopology, consume, with_delayed_retry
from delayed_retry.headers import X_QUEUE, X_RETRY
from delayed_retry.parking.shortcuts import parse_parked
from tests.support.queues import delete_all, depth
from tests.support.waiting import wait_until

from ._support import QUORUM, Ledger, publish_ids

MESSAGES = 50


async def test_messages_of_a_deleted_queue_are_kept_as_unroutable(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel = await connection.channel()
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=14)
    ledger = Ledger(sent=set(range(MESSAGES)))
    failed: set[int] = set()

    @with_delayed_retry(max_retries=3, wait=tenacity.wait_fixed(3), topology=topology)
    async def handle(message: AbstractIncomingMessage) -> None:
        failed.add(json.loads(message.body)["id"])
        raise RuntimeError("fails, so the message waits 3 s in the chain")

    consumer_channel = await connection.channel()
    q = await consumer_channel.declare_queue(queue, durable=True, arguments=QUORUM)
    tag = await consume(q, handle)
    try:
        await publish_ids(channel, queue, sorted(ledger.sent))

        async def all_in_chain() -> bool:
            levels = [await depth(channel, topology.level_name(k)) for k in range(14)]
            return sum(levels) == MESSAGES and await depth(channel, queue) == 0

        await wait_until(all_in_chain, timeout=30, what="every message handed to the chain")
        assert failed == ledger.sent
        await q.cancel(tag)
        await consumer_channel.close()
        # Deleted while every message is still in the chain.
        await channel.queue_delete(queue, if_unused=False, if_empty=False)

        async def all_arrived() -> bool:
            return await depth(channel, topology.unroutable_queue) >= MESSAGES

        await wait_until(all_arrived, timeout=40, what="the messages in the unroutable queue")
        assert await depth(channel, topology.unroutable_queue) == MESSAGES
        unroutable = await channel.declare_queue(topology.unroutable_queue, passive=True)
        while (message := await unroutable.get(fail=False, no_ack=False)) is not None:
            i = json.loads(message.body)["id"]
            ledger.parked[i] += 1
            headers = message.headers
            assert headers[X_QUEUE] == queue
            assert headers[X_RETRY] == 1
            record = parse_parked(
                headers,
                message_id=message.message_id,
                body=message.body,
                exchange=message.exchange,
                routing_key=message.routing_key,
            )
            assert record.reason == "unroutable", (message.exchange, record)
            await message.ack()
        # The alerts queue got a copy of each, for whoever watches parking.
        assert await depth(channel, topology.alerts_queue) == MESSAGES
        counts = ledger.report("destination-deleted-while-delayed")
        assert counts["lost"] == 0
        assert counts["parked"] == MESSAGES
    finally:
        await delete_all(channel, topology=topology, queues=[queue])
