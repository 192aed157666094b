"""A consumer whose cause is not fixed: it retries each message after fixed waits, then parks it.

Canary tests need records whose retries take time (the parking record then
spans them) and a consumer that takes as long again to park a replayed copy.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence

import aio_pika
import aiormq
from aio_pika.abc import AbstractIncomingMessage
from tenacity import wait_chain, wait_fixed

from delayed_retry import with_delayed_retry
from tests.support.chain import Scenario
from tests.support.waiting import wait_until

RETRY_WAITS = (1.0, 2.0)
"""Seconds before each retry: a message parks about 3 s after its first failure."""


class StillBroken(Exception):
    """What the handler raises for every message."""


async def fail_with_retries(
    scenario: Scenario, queue: str, *, waits: Sequence[float] = RETRY_WAITS
) -> Callable[[], Awaitable[None]]:
    """Consume ``queue``: each message fails, is retried after ``waits``, then parks.

    Returns the function that stops the consumer.
    """
    channel = await scenario.connection.channel()
    declared = await channel.declare_queue(queue, durable=True)

    @with_delayed_retry(
        queue=queue,
        topology=scenario.topology,
        max_retries=len(waits),
        wait=wait_chain(*(wait_fixed(w) for w in waits)),
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        raise StillBroken(f"customer_id missing in {message.message_id}")

    tag = await declared.consume(handle)

    async def stop() -> None:
        await declared.cancel(tag)
        await channel.close()

    return stop


async def park_after_retries(scenario: Scenario, queue: str, count: int) -> list[str]:
    """Publish ``count`` messages to ``queue`` and return their ids once all have parked.

    A consumer from :func:`fail_with_retries` must be running.
    """
    channel = await scenario.connection.channel()
    ids = [f"order-{n}" for n in range(count)]
    for ident in ids:
        await channel.default_exchange.publish(
            aio_pika.Message(json.dumps({"order": ident}).encode(), message_id=ident),
            routing_key=queue,
        )
    await channel.close()
    parking = scenario.topology.default_parking_queue(queue)

    async def parked() -> bool:
        try:
            return await scenario.depth(parking) == count
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False  # declared when the first message parks

    await wait_until(parked, timeout=30, what=f"{count} messages to park in {parking!r}")
    return ids
