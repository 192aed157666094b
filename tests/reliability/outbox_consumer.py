"""A consumer process with an outbox, for the crash test: run it, kill it, run it again.

    python outbox_consumer.py URL QUEUE DOWNSTREAM PREFIX EVENT_FILE MODE

The handler publishes two messages to DOWNSTREAM through its outbox and fails
on its first two attempts. MODE ``stop-before-ack`` stops the process right
before the ack that follows its success (the held publishes confirmed): it
writes ``released`` to EVENT_FILE and waits there, to be killed; the acks of
the retries' hand-overs go through. MODE ``run`` acks, then writes ``acked``.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage

import delayed_retry.consumer.handover as handover
from delayed_retry import (
    DelayTopology,
    consume,
    current_outbox,
    current_retry_state,
    with_delayed_retry,
)


def note(event_file: str, text: str) -> None:
    """Tell the test how far the delivery went."""
    Path(event_file).write_text(text)


async def main() -> None:
    url, queue_name, downstream, prefix, event_file, mode = sys.argv[1:7]
    topology = DelayTopology(prefix=prefix, levels=12, unit=timedelta(milliseconds=1))
    original_ack = handover.ack
    succeeded: set[int | None] = set()
    # The deliveries whose handler returned: their ack follows the outbox's release.

    async def reporting_ack(message: AbstractIncomingMessage, queue: str) -> None:
        if message.delivery_tag not in succeeded:  # the ack of a retry's hand-over
            await original_ack(message, queue)
            return
        if mode == "stop-before-ack":
            note(event_file, "released")
            await asyncio.Future()  # killed here, the message unacked
        await original_ack(message, queue)
        note(event_file, "acked")

    handover.ack = reporting_ack

    @with_delayed_retry(
        max_retries=3, wait=tenacity.wait_fixed(0.05), topology=topology, outbox=True
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        for n in (1, 2):
            current_outbox().publish(f"follow-up {n}".encode(), routing_key=downstream)
        state = current_retry_state()
        assert state is not None
        if state.attempt <= 2:
            raise RuntimeError(f"fails on attempt {state.attempt}")
        succeeded.add(message.delivery_tag)

    connection = await aio_pika.connect_robust(url)
    channel = await connection.channel()
    queue = await channel.declare_queue(queue_name, passive=True)
    await consume(queue, handle)
    print("consuming", flush=True)
    await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
