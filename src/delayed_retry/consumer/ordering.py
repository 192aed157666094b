"""Order per key, the broker half: a consumer with ``ordered_by=`` runs the messages of a key
in the order they arrived, across retries.

While a message of key K waits in the chain for a retry, the later messages of K
wait behind it in the queue's *order queue* (``<queue>.order``), and run in
order once it succeeds or parks. The order queue holds the partition's state:

- a *block* record per waiting key (its key, the waiting message's token, its
  due time), written before the message leaves for the chain;
- a *deferred* record per message waiting behind a key (the message itself,
  with its key and sequence number), written before the message is acked.

The consumer holding the partition holds every record unacked; a record is
acked when the key is released or the message has run. A consumer that takes
the partition over (the queue is single-active-consumer, and so is its order
queue) reads the records back up to a marker it publishes itself. A blocker
that never comes back (purged, discarded) releases its key ``release_after``
seconds past its due time. The pure half is :mod:`delayed_retry.recovery.ordering`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

import aiormq
import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.message import IncomingMessage

from delayed_retry.amqp.channels import close_quietly
from delayed_retry.amqp.publish import copy_properties, publish_confirmed
from delayed_retry.chain.topology import DELIVERY_LIMIT
from delayed_retry.consumer.handover import RequeueBackoff, requeue_after_backoff
from delayed_retry.durations import to_epoch_ms
from delayed_retry.headers.names import (
    X_DUE_AT,
    X_ORDER_KEY,
    X_ORDER_RECORD,
    X_ORDER_SEQ,
    X_ORDER_TOKEN,
)
from delayed_retry.headers.values import sanitize_headers
from delayed_retry.recovery.ordering import Block, Deferred, OrderBook, order_token

__all__ = ["KeyOrdering", "Outcome", "order_queue_name", "ORDER_QUEUE_ARGUMENTS"]

log = logging.getLogger(__name__)

Outcome = Literal["done", "retried", "requeued"]
"""How a delivery ended: settled for good (handled, parked), sent into the chain for a
retry, or back in its queue (it will be delivered again)."""

Record = aiormq.abc.DeliveredMessage
Run = Callable[[AbstractIncomingMessage], Awaitable[Outcome]]

ORDER_QUEUE_ARGUMENTS: dict[str, Any] = {
    "x-queue-type": "quorum",
    "x-single-active-consumer": True,
    "x-delivery-limit": DELIVERY_LIMIT,
}
"""The order queue's arguments: replicated, read by one consumer at a time, and every record
given back at each takeover kept (no delivery limit a return could reach)."""

HELD_LIMIT = 50_000
"""Records a consumer holds per partition at most. A message of a waiting key that arrives
beyond it goes back to its queue after a pause (it comes back in turn): memory stays bounded,
and the broker never stops delivering records (a quorum queue caps a consumer's unacked
messages at its prefetch: :data:`_ORDER_PREFETCH`, above this limit)."""

_ORDER_PREFETCH = 65_535  # the largest prefetch AMQP can say; 0 means 2,000 on a quorum queue
_ARRIVAL_TIMEOUT = 60.0  # a record confirmed but not delivered back: given back, tried again

_MARKER = "marker"
_BLOCK = "block"
_DEFERRED = "deferred"


def order_queue_name(queue: str) -> str:
    """The order queue of ``queue``: where its waiting keys and their messages are kept."""
    return f"{queue}.order"


class KeyOrdering:
    """Keeps the messages of each key in order for one consumed queue (``ordered_by=``).

    One per handler and queue; it holds a :class:`_Partition` per consumer channel.
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
        self.partitions: weakref.WeakKeyDictionary[object, _Partition] = weakref.WeakKeyDictionary()

    def key_of(self, message: AbstractIncomingMessage) -> str | None:
        """The key of ``message``: its ``x-retry-order-key`` header, else ``ordered_by``'s.

        ``None`` when it has none, or ``ordered_by`` fails on it or returns no str: it then
        runs unordered (logged), through the same retries and parking as any message.
        """
        key = _text(message.headers.get(X_ORDER_KEY))
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
        partition = self.partitions.get(message.channel)
        if partition is None or partition.lost:
            partition = self.partitions[message.channel] = _Partition(self, message.channel, run)
        headers = message.headers
        token = str(headers.get(X_ORDER_TOKEN) or "") or order_token(
            message.message_id, message.body, headers
        )
        headers[X_ORDER_KEY], headers[X_ORDER_TOKEN] = key, token  # retry copies carry both
        if not partition.loaded:
            try:
                await partition.ready()
            except Exception as exc:  # refused or cut off: the next delivery tries again
                partition.lose()
                await self._give_back(message, exc)
                return
        locks = partition.locks
        lock = locks.take(key)  # no await before it: deliveries take their key in order
        try:
            async with lock:
                await self._in_turn(partition, message, key, token, run)
        finally:
            locks.give_back(key)

    async def _in_turn(
        self,
        partition: _Partition,
        message: AbstractIncomingMessage,
        key: str,
        token: str,
        run: Run,
    ) -> None:
        """With ``key``'s lock: defer ``message``, or run it and release its key after."""
        if partition.book.must_wait(key, token):
            try:
                await partition.defer(message, key, token)
            except Exception as exc:  # not kept: back to its queue, in turn (the lock is held)
                await self._give_back(message, exc)
            return
        if await run(message) != "done":
            return  # in the chain (its key waits for it), or back in the queue
        block = partition.book.unblock(key, token)
        if block is not None:
            await partition.released(block)

    async def _give_back(self, message: AbstractIncomingMessage, exc: Exception) -> None:
        """Requeue ``message`` after a pause that grows with each in a row (never lost)."""
        if not message.processed:
            await requeue_after_backoff(message, self.queue, exc, self._backoff)

    def loaded(self) -> None:
        """A partition was read back: the requeues in a row end."""
        self._backoff.reset()

    async def record_block(self, message: AbstractIncomingMessage, due_at: datetime) -> None:
        """Before ``message`` leaves for the chain: its key waits for it (written first)."""
        partition = self.partitions.get(message.channel)
        key = message.headers.get(X_ORDER_KEY)
        if partition is None or not isinstance(key, str):
            return  # not ordered (no key), or an order-queue delivery's partition below
        await partition.record_block(key, str(message.headers[X_ORDER_TOKEN]), due_at)


class _Partition:
    """What one consumer channel holds of one queue's order: the book and its records."""

    def __init__(self, owner: KeyOrdering, consumer: Any, run: Run) -> None:
        self.owner = owner
        self.order_queue = order_queue_name(owner.queue)
        self.consumer = consumer
        self.run = run
        self.book: OrderBook[Record] = OrderBook()
        self.locks = _KeyLocks()
        self.lost = False
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._loading: asyncio.Task[None] | None = None
        self._marker = uuid.uuid4().hex
        self._arrivals: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def loaded(self) -> bool:
        """Whether the records are read back (checked on every delivery, no await)."""
        return self._loading is not None and self._loading.done() and not self._loading.cancelled()

    async def ready(self) -> None:
        """Wait until the partition's records are read back (at once once they are)."""
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load())
        await asyncio.shield(self._loading)

    async def _load(self) -> None:
        """Open the order channel, consume the order queue and read it up to our marker."""
        connection = self.consumer.connection
        channel = await connection.channel(publisher_confirms=True)
        self._channel = channel
        channel.closing.add_done_callback(lambda _: self.lose())
        self.consumer.closing.add_done_callback(lambda _: self.lose())
        self.owner.partitions[channel] = self  # its deliveries' retries block their keys here
        await channel.queue_declare(
            self.order_queue, durable=True, arguments=dict(ORDER_QUEUE_ARGUMENTS)
        )
        await channel.basic_qos(prefetch_count=_ORDER_PREFETCH)
        marked = self._arrival(_MARKER, self._marker)
        await channel.basic_consume(self.order_queue, self._on_record)
        await self._publish(headers={X_ORDER_RECORD: _MARKER, X_ORDER_TOKEN: self._marker})
        waited = 0.0
        while not marked.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(marked), 30)
            if not marked.done():
                waited += 30
                log.warning(
                    "still waiting %.0f s to take over %r: another consumer holds it (it "
                    "releases it when its channel closes); deliveries of ordered keys wait",
                    waited,
                    self.order_queue,
                )
        for key in list(self.book.ready_keys()):
            self._spawn(self._drain(key))
        self.owner.loaded()
        self._spawn(self._sweep())

    def lose(self) -> None:
        """The order channel or the consumer's channel closed: everything is read again."""
        if self.lost:
            return
        self.lost = True
        for task in self._tasks:
            task.cancel()
        if self._channel is not None:
            self._spawn_detached(close_quietly(self._channel))
        for arrival in self._arrivals.values():
            if not arrival.done():
                arrival.set_exception(ConnectionError(f"{self.order_queue!r}: channel closed"))
                arrival.add_done_callback(_retrieved)  # its delivery may be gone already

    async def _on_record(self, record: Record) -> None:
        """A record of the order queue: the marker, a block or a deferred message."""
        headers = record.header.properties.headers or {}
        kind, token = _text(headers.get(X_ORDER_RECORD)), _text(headers.get(X_ORDER_TOKEN))
        key, seq = _text(headers.get(X_ORDER_KEY)), headers.get(X_ORDER_SEQ)
        if kind == _MARKER:
            if token == self._marker:
                self._ack(record)
                self._arrived(_MARKER, token)
            # Another consumer's: it takes the partition over once this channel closes and
            # the marker goes back to the queue, unacked, behind every record held here.
            return
        if not key or not isinstance(seq, int) or kind not in (_BLOCK, _DEFERRED):
            log.error("dropping record %r of %r: not a record of order", headers, self.order_queue)
            self._ack(record)
            return
        if kind == _BLOCK:
            due = headers.get(X_DUE_AT)
            block = Block(key, token, due if isinstance(due, int) else 0, seq, record)
            for replaced in self.book.block(block):
                self._ack(replaced.record)
        else:
            self.book.defer(Deferred(key, token, seq, record))
            if self._loading is not None and self._loading.done() and key not in self.locks:
                self._spawn(self._drain(key))  # a requeued one came back: run it in turn
        self._arrived(kind, token)

    async def defer(self, message: AbstractIncomingMessage, key: str, token: str) -> None:
        """Keep ``message`` behind ``key`` in the order queue (confirmed, read back), then ack
        it. A redelivery of one already kept is only acked."""
        if not self.book.is_deferred(key, token):
            if self.book.held() >= HELD_LIMIT:
                raise OrderQueueFullError(
                    f"{self.order_queue!r} holds {HELD_LIMIT} records: message "
                    f"{message.message_id} of waiting key {key!r} goes back to its queue until "
                    "the keys ahead of it are released"
                )
            seq = self.book.next_seq()
            headers = sanitize_headers(message.headers)
            headers.update({X_ORDER_RECORD: _DEFERRED, X_ORDER_SEQ: seq})
            arrived = self._arrival(_DEFERRED, token)
            await self._publish(headers=headers, body=message.body, like=message)
            await asyncio.wait_for(arrived, _ARRIVAL_TIMEOUT)
        await message.ack()

    async def record_block(self, key: str, token: str, due_at: datetime) -> None:
        """Key ``key`` waits for ``token`` until ``due_at``: confirmed and read back."""
        current = self.book.blocks.get(key)
        if current is not None and current.token == token:
            return  # a retry of the blocker itself: its key waits for it already
        arrived = self._arrival(_BLOCK, token)
        await self._publish(
            headers={
                X_ORDER_RECORD: _BLOCK,
                X_ORDER_KEY: key,
                X_ORDER_TOKEN: token,
                X_ORDER_SEQ: self.book.next_seq(),
                X_DUE_AT: to_epoch_ms(due_at),
            }
        )
        await asyncio.wait_for(arrived, _ARRIVAL_TIMEOUT)

    async def released(self, block: Block[Record]) -> None:
        """``block``'s message ran for good (or is gone): ack the block, run what waited
        behind its key. The caller holds the key's lock."""
        self._ack(block.record)
        await self._drain_held(block.key)

    async def _drain(self, key: str) -> None:
        async with self.locks.hold(key):
            await self._drain_held(key)

    async def _drain_held(self, key: str) -> None:
        """Run the messages waiting behind ``key`` in order until one leaves for the chain
        (its key waits for it again) or goes back to the order queue (it runs when back)."""
        while (deferred := self.book.next_deferred(key)) is not None:
            message = IncomingMessage(deferred.record, no_ack=False)
            for name in (X_ORDER_RECORD, X_ORDER_SEQ):  # the record's own, not the message's
                message.headers.pop(name, None)
            outcome = await self.run(message)
            self.book.done(deferred)
            if outcome == "requeued":  # back in the order queue: run again once it is back
                self._spawn(self._drain(key))
            if outcome != "done":
                return

    async def _sweep(self) -> None:
        """Release the keys whose blocker is overdue: it was purged or discarded."""
        grace_ms = int(self.owner.release_after * 1000)
        while True:
            await asyncio.sleep(min(1.0, self.owner.release_after))
            for key in self.book.overdue(int(time.time() * 1000), grace_ms):
                self._spawn(self._release_overdue(key))

    async def _release_overdue(self, key: str) -> None:
        async with self.locks.hold(key):
            block = self.book.blocks.get(key)
            grace_ms = int(self.owner.release_after * 1000)
            if block is None or key not in self.book.overdue(int(time.time() * 1000), grace_ms):
                return  # released meanwhile: its message came back
            log.warning(
                "key %r of queue %r waited %.0f s past the due time of message %s, which "
                "did not come back from the chain (purged or discarded?); releasing the key",
                key,
                self.owner.queue,
                self.owner.release_after,
                block.token,
            )
            self.book.unblock(key)
            await self.released(block)

    async def _publish(
        self,
        *,
        headers: dict[str, Any],
        body: bytes = b"",
        like: AbstractIncomingMessage | None = None,
    ) -> None:
        channel = self._channel
        if channel is None or self.lost:
            raise ConnectionError(f"the order channel of {self.order_queue!r} is closed")
        properties = copy_properties(None if like is None else like.properties, headers)
        await publish_confirmed(
            channel,
            exchange="",
            routing_key=self.order_queue,
            body=body,
            properties=properties,
            timeout=self.owner.publish_timeout,
        )

    def _arrival(self, kind: str, token: str) -> asyncio.Future[None]:
        arrival = self._arrivals[(kind, token)] = asyncio.get_running_loop().create_future()
        return arrival

    def _arrived(self, kind: str, token: str) -> None:
        arrival = self._arrivals.pop((kind, token), None)
        if arrival is not None and not arrival.done():
            arrival.set_result(None)

    def _ack(self, record: Record) -> None:
        channel = self._channel
        if channel is not None and not channel.is_closed and record.delivery_tag is not None:
            self._spawn_detached(channel.basic_ack(record.delivery_tag))

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("ordering of %r failed", self.order_queue, exc_info=task.exception())

    def _spawn_detached(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())


class OrderQueueFullError(Exception):
    """A partition holds :data:`HELD_LIMIT` records: the message is given back for now."""


class _KeyLocks:
    """One lock per key while anything holds or waits for it; FIFO, so arrival order holds."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._locks

    def take(self, key: str) -> asyncio.Lock:
        """``key``'s lock, counted as used until :meth:`give_back`."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        return lock

    def give_back(self, key: str) -> None:
        """One use of ``key``'s lock ended; the lock is dropped when none is left."""
        lock, users = self._locks[key]
        if users == 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the block (for the rare paths: drains, releases)."""
        lock = self.take(key)
        try:
            async with lock:
                yield
        finally:
            self.give_back(key)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return value if isinstance(value, str) else ""


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark ``future``'s exception as seen: nobody may be left to await it."""
    if not future.cancelled():
        future.exception()
