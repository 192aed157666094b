"""The broker restarted, or killed, while thousands of messages sit in the delay chain.

Quorum queues with at-least-once dead-lettering keep every confirmed message
through a restart; each comes due afterwards, and none before its due time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DelayTopology, declare_topology, publish_delayed
from harness import RabbitMQNode
from tests.support.nodes import CONFIRM_TIMEOUT_MS, private_node
from tests.support.queues import depth
from tests.support.waiting import wait_until

from ._support import QUORUM, Ledger

MESSAGES = 2000


@pytest.fixture(scope="module")
def node() -> Iterator[RabbitMQNode]:
    """This module's node: a kill can catch messages between two levels of the chain.

    The at-least-once dead-letter worker sends such a message again when its publish
    confirm times out (``dead_letter_worker_publisher_confirm_timeout``, 180 s by
    default); 10 s here keeps the test about what arrives, not about that wait.
    """
    yield from private_node(
        rabbit_env={"dead_letter_worker_publisher_confirm_timeout": CONFIRM_TIMEOUT_MS}
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", ["restart", "kill"])
async def test_messages_in_the_chain_survive_a_broker_restart(
    running_node: RabbitMQNode, unique: str, fault: str
) -> None:
    node = running_node
    queue = f"{unique}.due"
    topology = DelayTopology(prefix=unique, levels=16)
    ledger = Ledger(sent=set(range(MESSAGES)))
    due: dict[int, datetime] = {}

    connection = await aio_pika.connect(node.url)
    channel = await connection.channel()
    await channel.declare_queue(queue, durable=True, arguments=QUORUM)
    await declare_topology(channel, topology, queues=[queue])
    # RabbitMQ 3.10 saves a new quorum queue's registry entry and Raft term lazily (up to
    # 5 s later); a node killed sooner brings the queue itself back leaderless, whatever
    # its messages. That is the broker's weakness for fresh queues, not what this test
    # is about (messages inside a long-declared chain), so save the metadata first.
    await asyncio.to_thread(node.flush_metadata)

    async def schedule(i: int) -> None:
        # Delays of 3 to 9 s: every message is inside the chain while the broker is down.
        delay = timedelta(seconds=3 + (i % 61) / 10)
        message = aio_pika.Message(json.dumps({"id": i}).encode(), message_id=str(i))
        due[i] = await publish_delayed(
            channel, message, queue=queue, delay=delay, topology=topology
        )

    for start in range(0, MESSAGES, 250):
        await asyncio.gather(*(schedule(i) for i in range(start, min(start + 250, MESSAGES))))
    arrived_before = await depth(channel, queue)
    await connection.close()
    # The fault must hit messages that are still travelling through the chain.
    assert arrived_before < MESSAGES // 2, f"{arrived_before} already arrived before the {fault}"

    began = time.monotonic()
    if fault == "restart":
        node.restart()
    else:
        node.kill()
        node.start()
    print(f"broker {fault} took {time.monotonic() - began:.1f} s")

    early: list[tuple[int, float]] = []
    connection = await aio_pika.connect(node.url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=500)
        q = await channel.declare_queue(queue, passive=True)

        async def on_message(message: AbstractIncomingMessage) -> None:
            arrived = datetime.now(UTC)
            i = json.loads(message.body)["id"]
            if arrived < due[i] - timedelta(milliseconds=2):
                early.append((i, (due[i] - arrived).total_seconds()))
            ledger.handled[i] += 1
            await message.ack()

        await q.consume(on_message)
        await wait_until(
            lambda: set(ledger.handled) >= ledger.sent,
            # A message the crash caught between two levels is dead-lettered again when the
            # broker's at-least-once dead-letter worker times out its unconfirmed publish
            # (10 s on this node, see ``node``). Late, not lost.
            timeout=240,
            what=f"all {MESSAGES} delayed messages after the broker {fault}",
        )
        counts = ledger.report(f"broker-{fault}-with-{MESSAGES}-in-chain")
        assert counts["lost"] == 0
        assert early == [], f"{len(early)} message(s) arrived early, e.g. {early[:5]}"
        await channel.queue_delete(queue, if_unused=False, if_empty=False)
    finally:
        await connection.close()
