"""Helpers of the reliability tests: a ledger of sent, handled and parked ids; publish, drain.

Waiting, queue depths, clean-up and private nodes to break come from :mod:`tests.support`.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from pamqp.common import FieldTable

QUORUM: FieldTable = {"x-queue-type": "quorum"}


@dataclass
class Ledger:
    """Which message ids were sent, handled (with repeats) and parked (with repeats)."""

    sent: set[int] = field(default_factory=set)
    handled: Counter[int] = field(default_factory=Counter)
    parked: Counter[int] = field(default_factory=Counter)

    @property
    def lost(self) -> set[int]:
        return self.sent - set(self.handled) - set(self.parked)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.handled.values()) + sum(n - 1 for n in self.parked.values())

    def summary(self) -> dict[str, int]:
        """The counts a reliability test ends with (also printed, for the report)."""
        return {
            "sent": len(self.sent),
            "handled": len(set(self.handled) & self.sent),
            "parked": len(set(self.parked) & self.sent),
            "duplicates": self.duplicates,
            "lost": len(self.lost),
        }

    def report(self, name: str) -> dict[str, int]:
        counts = self.summary()
        print(f"COUNTS {name}: {json.dumps(counts)}")
        return counts


async def publish_ids(
    channel: AbstractChannel,
    queue: str,
    ids: Iterable[int],
    *,
    extra: Callable[[int], dict[str, object]] | None = None,
    headers: FieldTable | None = None,
) -> None:
    """Publish ``{"id": i, ...}`` bodies to ``queue`` with confirms, concurrently in batches."""
    batch: list[Awaitable[object]] = []
    for i in ids:
        body = {"id": i, **(extra(i) if extra else {})}
        batch.append(
            channel.default_exchange.publish(
                aio_pika.Message(
                    json.dumps(body).encode(),
                    message_id=str(i),
                    headers=headers,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=queue,
            )
        )
        if len(batch) >= 200:
            await asyncio.gather(*batch)
            batch = []
    await asyncio.gather(*batch)


def body_id(message: AbstractIncomingMessage) -> int:
    return int(json.loads(message.body)["id"])


async def drain_ids(channel: AbstractChannel, queue: str) -> list[int]:
    """Take every message out of ``queue`` (acking) and return their ids."""
    q = await channel.declare_queue(queue, passive=True)
    ids = []
    while (message := await q.get(fail=False, no_ack=False)) is not None:
        ids.append(body_id(message))
        await message.ack()
    return ids
