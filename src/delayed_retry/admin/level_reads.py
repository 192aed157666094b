"""Reading level queues whole, holding every message read, and giving them all back.

Use :class:`HeldReads` where an operation must see every message waiting in a level queue
and leave the ones it does not take where they were (a discard). A message read is held
unacked, so it can neither expire nor be read twice; :meth:`HeldReads.give_back` returns
them all with one ``basic.nack``. A level is read by a consumer with a wide prefetch
window, then by ``basic.get`` until the queue has nothing more to give; why, and how long
it takes: docs/scheduling.md, "Cancelling a scheduled message".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import aiormq
import aiormq.abc

from delayed_retry.amqp.consumers import consume_to_scan

__all__ = ["FEW", "WINDOW", "HeldReads"]

WINDOW = 10_000
"""Messages a level's consumer may be given unacked; ``basic.get`` reads past it."""

FEW = 16
"""Below this many ready messages a level is read by ``basic.get`` alone: a consumer's start
and cancel cost more than they save."""

_STALLED_POLLS = 5
"""Counts in a row with messages ready and none delivered meanwhile: read the rest by get."""


class HeldReads:
    """Messages read unacked from level queues on ``own``, held until :meth:`give_back`.

    Call :meth:`settled` for each message acked (taken out); every other one
    read stays held.
    """

    def __init__(self, own: aiormq.abc.AbstractChannel) -> None:
        self._own = own
        self._held: set[int] = set()
        self._consumers: list[str] = []
        self._window_set = False

    @property
    def held(self) -> int:
        """Messages read and not settled."""
        return len(self._held)

    def settled(self, delivery_tag: int) -> None:
        """``delivery_tag`` was acked: it is no longer held."""
        self._held.discard(delivery_tag)

    async def read(self, queue: str) -> AsyncGenerator[aiormq.abc.DeliveredMessage, None]:
        """Every message of ``queue`` not read yet, taken unacked, in queue order.

        A loop may stop early: what the level's consumer is given meanwhile is
        held, unread, and given back with the rest.
        """
        own = self._own
        declared = await own.queue_declare(queue, passive=True)
        if (declared.message_count or 0) < FEW:
            async for got in self._get_all(queue):
                yield got
            return
        if not self._window_set:
            await own.basic_qos(prefetch_count=WINDOW)
            self._window_set = True
        arrived: asyncio.Queue[aiormq.abc.DeliveredMessage] = asyncio.Queue()

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            self._held.add(message.delivery_tag or 0)
            arrived.put_nowait(message)

        tag = await consume_to_scan(own, queue, on_message)
        # Cancelled only in give_back, with every other one: on 3.10 a quorum queue may
        # still be sending to a consumer being cancelled, and the broker's channel drops
        # such a delivery (the message stays with the consumer until the channel closes).
        # Kept, the consumer receives it, and it is held and given back like the others.
        self._consumers.append(tag)
        stalled = 0
        while stalled < _STALLED_POLLS:
            while not arrived.empty():
                yield arrived.get_nowait()
            declared = await own.queue_declare(queue, passive=True)
            if not declared.message_count:
                break
            # A full window or a count that lags: basic.get reads the rest.
            stalled = 0 if arrived.qsize() else stalled + 1
        while not arrived.empty():
            yield arrived.get_nowait()
        async for got in self._get_all(queue):
            yield got
        # What was on its way to the consumer when the count said none were ready.
        while not arrived.empty():
            yield arrived.get_nowait()

    async def _get_all(self, queue: str) -> AsyncGenerator[aiormq.abc.DeliveredMessage, None]:
        while True:
            got = await self._own.basic_get(queue, no_ack=False)
            if got.delivery_tag is None:
                return
            self._held.add(got.delivery_tag)
            yield got

    async def give_back(self) -> None:
        """Stop the level consumers, then return every held message with one ``basic.nack``."""
        if self._own.is_closed:
            return  # a closed channel gave them back already
        for consumer_tag in self._consumers:
            # Requeued to a consumer still there, a message would come straight back to it.
            await self._own.basic_cancel(consumer_tag)
        self._consumers.clear()
        # Deliveries read before the last cancel-ok run their callback before this resumes.
        await asyncio.sleep(0)
        if self._held:
            await self._own.basic_nack(max(self._held), multiple=True, requeue=True)
            self._held.clear()
