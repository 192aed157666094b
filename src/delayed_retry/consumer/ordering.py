"""Order per key, the broker half: a consumer with ``ordered_by=`` runs the messages of a key
in the order they arrived, across retries.

While a message of key K waits in the chain for a retry, the later messages of K
wait behind it in the queue's *order queue* (``<queue>.order``), and run in
order once it succeeds or parks (:class:`KeyOrdering`, the decisions). The
records that keep this across a crash or a takeover, and the consumer that holds
them, are :mod:`delayed_retry.consumer.order_partition`; the book is
:mod:`delayed_retry.recovery.ordering`. A message that never comes back
(purged, discarded) releases its key ``release_after`` seconds past its due time.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from datetime import datetime

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.consumer.handover import RequeueBackoff, requeue_after_backoff
from delayed_retry.consumer.order_partition import Partition, Run
from delayed_retry.headers.names import X_ORDER_KEY, X_ORDER_TOKEN
from delayed_retry.headers.text import header_text
from delayed_retry.recovery.ordering import order_token

__all__ = ["KeyOrdering"]

log = logging.getLogger(__name__)


class KeyOrdering:
    """Keeps the messages of each key in order for one consumed queue (``ordered_by=``).

    One per handler and queue; it holds a :class:`~delayed_retry.consumer.order_partition.
    Partition` per consumer channel (and finds it by its order channel too).
    """

    def __init__(
        self,
        ordered_by: Callable[[AbstractIncomingMessage], str | None],
        *,
        queue: str,
        release_after: float,
        publish_timeout: float,
    ) -> None:
        self.ordered_by = ordered_by
        self.queue = queue
        self.release_after = release_after
        self.publish_timeout = publish_timeout
        self._backoff = RequeueBackoff()
        self.partitions: weakref.WeakKeyDictionary[object, Partition] = weakref.WeakKeyDictionary()

    def key_of(self, message: AbstractIncomingMessage) -> str | None:
        """The key of ``message``: its ``x-retry-order-key`` header, else ``ordered_by``'s.

        ``None`` when it has none, or ``ordered_by`` fails on it or returns no str: it then
        runs unordered (logged), through the same retries and parking as any message.
        """
        key = header_text(message.headers.get(X_ORDER_KEY))
        if key:
            return key
        try:
            found = self.ordered_by(message)
            if found is None or isinstance(found, str):
                return found
            raise TypeError(f"returned {found!r}, not a str")
        except Exception as exc:
            log.error(
                "ordered_by=%r failed on message %s from queue %r (%r); it runs without order: "
                "make ordered_by return a str key (or None) for every message",
                self.ordered_by,
                message.message_id,
                self.queue,
                exc,
            )
            return None

    async def deliver(self, message: AbstractIncomingMessage, run: Run) -> None:
        """Run ``message`` in its key's order: now, or behind its key's waiting message."""
        key = self.key_of(message)
        if key is None:
            await run(message)
            return
        partition = self._partition(message.channel, run)
        headers = message.headers
        token = header_text(headers.get(X_ORDER_TOKEN)) or order_token(
            message.message_id, message.body, headers
        )
        headers[X_ORDER_KEY], headers[X_ORDER_TOKEN] = key, token  # retry copies carry both
        locks = partition.locks
        lock = locks.take(key)  # no await before it: deliveries take their key in order
        try:
            async with lock:
                await self._in_turn(partition, message, key, token, run)
        finally:
            locks.give_back(key)

    def _partition(self, channel: object, run: Run) -> Partition:
        """The partition held on the consumer ``channel``: a new one after a loss."""
        partition = self.partitions.get(channel)
        if partition is None or partition.lost:
            partition = Partition(
                queue=self.queue,
                consumer=channel,
                run=run,
                release_after=self.release_after,
                timeout=self.publish_timeout,
            )
            partition.on_lost = self._forget
            closing = getattr(channel, "closing", None)
            if closing is not None:
                closing.add_done_callback(lambda _: partition.lose())
            self.partitions[channel] = partition
        return partition

    def _forget(self, partition: Partition) -> None:
        for channel in (partition.consumer, partition.channel):
            if channel is not None and self.partitions.get(channel) is partition:
                del self.partitions[channel]

    async def _in_turn(
        self,
        partition: Partition,
        message: AbstractIncomingMessage,
        key: str,
        token: str,
        run: Run,
    ) -> None:
        """With ``key``'s lock: defer ``message``, or run it; then what waits behind the key."""
        try:
            if not partition.loaded:
                try:
                    await partition.ready()
                except Exception:
                    partition.lose()  # the next delivery reads the records back anew
                    raise
                if partition.channel is not None:
                    self.partitions[partition.channel] = partition  # its records' retries
            if partition.lost:
                raise ConnectionError(f"the order channel of {partition.order_queue!r} closed")
            if partition.book.must_wait(key, token):
                await partition.defer(message, key, token)
                self._backoff.reset()
                await partition.drain_held(key)  # messages read back, ahead of this one
                return
        except Exception as exc:  # not kept: back to its queue, in turn (the lock is held)
            await self._give_back(message, exc)
            return
        outcome = await run(message)
        if outcome == "requeued":
            partition.wait_in_memory(key, token)  # the next of its key waits for it
        elif outcome == "done":
            block = partition.book.unblock(key, token)
            if block is not None:
                await partition.released(block)
            else:
                await partition.drain_held(key)

    async def _give_back(self, message: AbstractIncomingMessage, exc: Exception) -> None:
        """Requeue ``message`` after a pause that grows with each in a row (never lost)."""
        if not message.processed:
            await requeue_after_backoff(message, self.queue, exc, self._backoff)

    async def record_block(self, message: AbstractIncomingMessage, due_at: datetime) -> None:
        """Before ``message`` leaves for the chain: its key waits for it (written first)."""
        partition = self.partitions.get(message.channel)
        key = header_text(message.headers.get(X_ORDER_KEY))
        if partition is None or not key:
            return  # not ordered: it has no key
        token = header_text(message.headers.get(X_ORDER_TOKEN)) or ""
        await partition.record_block(key, token, due_at)
