"""A consumer killed between the confirmed hand-over and the ack: a duplicate, never a loss."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest

from delayed_retry import DEFAULT_HOLD, declare_topology
from delayed_retry import headers as h
from tests.support.chain import Inbox, Scenario
from tests.support.waiting import WAIT

pytestmark = pytest.mark.broker

CONSUMER = Path(__file__).parents[1] / "support" / "at_least_once_consumer.py"
LEVELS = 16


async def run_crashing_consumer(url: str, queue: str, prefix: str, max_retries: int) -> int:
    """Run the consumer process until it dies; return its exit code."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CONSUMER),
        url,
        queue,
        prefix,
        str(LEVELS),
        str(max_retries),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 45)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 1, output.decode(errors="replace")
    return process.returncode


async def test_crash_after_confirmed_retry_gives_a_duplicate_not_a_loss(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    queue = await quorum.queue()
    await declare_topology(quorum.ch, quorum.topology, queues=[queue.name])
    await quorum.ch.default_exchange.publish(
        aio_pika.Message(b"payment-9", message_id="payment-9"), queue.name
    )
    await run_crashing_consumer(rabbitmq_url, queue.name, quorum.topology.prefix, max_retries=3)

    inbox = Inbox()
    await queue.consume(inbox)
    deliveries = await inbox.take(2)
    by_retry = sorted(deliveries, key=lambda a: a.headers.get(h.X_RETRY, 0))
    original, copy = by_retry
    assert original.message.redelivered  # the unacked original came back
    assert h.X_RETRY not in original.headers
    assert copy.headers[h.X_RETRY] == 1  # and the confirmed retry copy arrived too
    # The copy left the chain at most the hold's lead before due (a decorated handler would
    # hold it until due; this plain consumer takes it as it comes).
    lead = DEFAULT_HOLD.longest_hold_us(quorum.topology) / 1e6
    assert copy.at >= copy.headers[h.X_DUE_AT] / 1000 - lead - 0.001
    assert {d.message.body for d in deliveries} == {b"payment-9"}
    await quorum.wait_for_depth(queue.name, 0)
    for spec in quorum.topology.queues():
        assert await quorum.depth(spec.name) == 0, spec.name
    assert inbox.pending() == 0


async def test_crash_after_confirmed_parking_gives_a_duplicate_not_a_loss(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    queue = await quorum.queue()
    await declare_topology(quorum.ch, quorum.topology, queues=[queue.name])
    await quorum.ch.default_exchange.publish(
        aio_pika.Message(b"payment-10", message_id="payment-10"), queue.name
    )
    await run_crashing_consumer(rabbitmq_url, queue.name, quorum.topology.prefix, max_retries=0)

    inbox = Inbox()
    await queue.consume(inbox)
    original = await inbox.get()
    assert original.message.redelivered
    assert original.message.body == b"payment-10"
    parking = await quorum.ch.get_queue(quorum.topology.default_parking_queue(queue.name))
    parked = await asyncio.wait_for(_get(parking), WAIT)
    assert parked.body == b"payment-10"
    assert (parked.headers or {})[h.X_PARKED_REASON] == "max-retries"


async def _get(queue: aio_pika.abc.AbstractQueue) -> aio_pika.abc.AbstractIncomingMessage:
    while (message := await queue.get(fail=False, no_ack=True)) is None:
        await asyncio.sleep(0.05)
    return message
