"""One partition's order records, held by the consumer that holds the partition.

The order queue (``<queue>.order``) keeps a partition's state as records:

- a *block* per waiting key (its key, the waiting message's token, its due time),
  written before the message leaves for the chain, again at each of its retries;
- a *deferred* record per message waiting behind a key (the message itself, its
  key and a sequence number), written before the message is acked;
- a *marker*, published by a consumer taking the partition over: every record
  delivered before it is the state the previous holder left.

:class:`Partition` holds every record unacked (a quorum queue returns them all
when its channel closes), acks a record once its key is released or its message
has run, and publishes a fresh copy of each record it has held for
:data:`REFRESH_AFTER` seconds (acking the old one), so that no record stays
unacked past the broker's ``consumer_timeout``. :class:`~delayed_retry.consumer.
ordering.KeyOrdering` decides; the book is :mod:`delayed_retry.recovery.ordering`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

import aiormq
import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.message import IncomingMessage
from pamqp.commands import Basic

from delayed_retry.amqp.channels import close_quietly
from delayed_retry.amqp.consumers import consume_to_scan
from delayed_retry.amqp.publish import copy_properties, publish_confirmed
from delayed_retry.chain.topology import DELIVERY_LIMIT
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import PublishTimeoutError
from delayed_retry.headers.names import (
    X_DUE_AT,
    X_ORDER_KEY,
    X_ORDER_RECORD,
    X_ORDER_SEQ,
    X_ORDER_TOKEN,
)
from delayed_retry.headers.text import header_text
from delayed_retry.headers.values import header_int, sanitize_headers
from delayed_retry.recovery.ordering import Block, Deferred, OrderBook

__all__ = [
    "HELD_LIMIT",
    "ORDER_QUEUE_ARGUMENTS",
    "REFRESH_AFTER",
    "KeyLocks",
    "OrderQueueFullError",
    "Outcome",
    "Partition",
    "order_queue_name",
]

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
beyond it goes back to its queue after a pause: memory stays bounded, and the broker never
stops delivering records (a quorum queue caps a consumer's unacked messages at its prefetch,
:data:`_ORDER_PREFETCH`, above this limit)."""

REFRESH_AFTER = 300.0
"""Seconds a record is held before a fresh copy replaces it: well inside RabbitMQ's
``consumer_timeout`` (30 minutes by default), which would close the channel holding it."""

_ORDER_PREFETCH = 65_535  # the largest prefetch AMQP can say; 0 means 2,000 on a quorum queue
_ARRIVAL_TIMEOUT = 60.0  # a record confirmed but not delivered back: the publish is tried again

_MARKER = "marker"
_BLOCK = "block"
_DEFERRED = "deferred"
_REFRESHED = "x-retry-order-refreshed"  # on a fresh copy: replaces its record if still held


def order_queue_name(queue: str) -> str:
    """The order queue of ``queue``: where its waiting keys and their messages are kept."""
    return f"{queue}.order"


class OrderQueueFullError(Exception):
    """A partition holds :data:`HELD_LIMIT` records: the message is given back for now."""


class Partition:
    """What one consumer channel holds of one queue's order: the book and its records."""

    def __init__(
        self, *, queue: str, consumer: Any, run: Run, release_after: float, timeout: float
    ) -> None:
        self.queue = queue
        self.order_queue = order_queue_name(queue)
        self.consumer = consumer
        self.run = run
        self.release_after = release_after
        self.publish_timeout = timeout
        self.book: OrderBook[Record] = OrderBook()
        self.locks = KeyLocks()
        self.lost = False
        self.on_lost: Callable[[Partition], None] | None = None
        self.channel: aiormq.abc.AbstractChannel | None = None
        self._loading: asyncio.Task[None] | None = None
        self._marker = uuid.uuid4().hex
        self._arrivals: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._held_since: dict[int, float] = {}
        self._running: set[str] = set()
        self._releasing: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def loaded(self) -> bool:
        """Whether the records are read back (checked on every delivery, no await)."""
        loading = self._loading
        return (
            loading is not None
            and loading.done()
            and not loading.cancelled()
            and loading.exception() is None
        )

    async def ready(self) -> None:
        """Wait until the partition's records are read back (at once once they are)."""
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load())
        await asyncio.shield(self._loading)

    async def _load(self) -> None:
        """Open the order channel, consume the order queue and read it up to our marker."""
        channel = await self.consumer.connection.channel(publisher_confirms=True)
        self.channel = channel
        channel.closing.add_done_callback(lambda _: self.lose())
        if self.lost:  # the consumer's channel closed meanwhile: this one must not hold on
            await close_quietly(channel)
            raise ConnectionError(f"the channel consuming {self.queue!r} closed")
        await channel.queue_declare(
            self.order_queue, durable=True, arguments=dict(ORDER_QUEUE_ARGUMENTS)
        )
        await channel.basic_qos(prefetch_count=_ORDER_PREFETCH)
        marked = self._arrival(_MARKER, self._marker)
        await consume_to_scan(channel, self.order_queue, self._on_record)
        await self._publish(headers={X_ORDER_RECORD: _MARKER, X_ORDER_TOKEN: self._marker})
        await self._wait_for_marker(marked)
        for key in list(self.book.ready_keys()):
            self._spawn(self._drain(key))
        self._spawn(self._sweep())
        self._spawn(self._refresh())

    async def _wait_for_marker(self, marked: asyncio.Future[None]) -> None:
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
        marked.result()  # raises when the channel closed meanwhile

    def lose(self) -> None:
        """The order channel or the consumer's channel closed: everything is read again.

        Called by either channel's closing; drops everything held (the broker returns the
        records), closes the order channel, and tells the owner to forget this partition.
        """
        if self.lost:
            return
        self.lost = True
        for task in self._tasks:
            task.cancel()
        if self.channel is not None:
            _detached(close_quietly(self.channel))
        for arrival in self._arrivals.values():
            if not arrival.done():
                arrival.set_exception(ConnectionError(f"{self.order_queue!r}: channel closed"))
                arrival.add_done_callback(_retrieved)  # its delivery may be gone already
        self._arrivals.clear()
        self._held_since.clear()
        self.book = OrderBook()
        if self.on_lost is not None:
            self.on_lost(self)

    async def _on_record(self, record: Record) -> None:
        """A record of the order queue: the marker, a block or a deferred message."""
        headers = record.header.properties.headers or {}
        kind = header_text(headers.get(X_ORDER_RECORD))
        token = header_text(headers.get(X_ORDER_TOKEN)) or ""
        key, seq = header_text(headers.get(X_ORDER_KEY)), header_int(headers.get(X_ORDER_SEQ))
        if self.lost:
            return  # this channel is closing: the broker gives the record back
        if kind == _MARKER:
            if token == self._marker:
                self._ack(record)
                self._arrived(_MARKER, token)
            # Another consumer's: it takes the partition over once this channel closes and
            # the marker goes back to the queue, unacked, behind every record held here.
            return
        if not key or seq is None or kind not in (_BLOCK, _DEFERRED):
            log.error("dropping record %r of %r: not a record of order", headers, self.order_queue)
            self._ack(record)
            return
        self._held_since[id(record)] = time.monotonic()
        if kind == _BLOCK:
            due = header_int(headers.get(X_DUE_AT)) or 0
            self._on_block(record, key, token, seq, due, refreshed=_REFRESHED in headers)
        else:
            self._on_deferred(record, key, token, seq, refreshed=_REFRESHED in headers)
        self._arrived(kind, token)

    def _on_block(
        self, record: Record, key: str, token: str, seq: int, due: int, *, refreshed: bool
    ) -> None:
        held = self.book.blocks.get(key)
        if refreshed and (held is None or (held.token, held.seq) != (token, seq)):
            self._ack(record)  # released since the copy was made: the key no longer waits
            return
        block = Block(key, token, due, seq, record)
        for replaced in self.book.block(block):
            self._ack(replaced.record)

    def _on_deferred(
        self, record: Record, key: str, token: str, seq: int, *, refreshed: bool
    ) -> None:
        if refreshed and self.book.find(key, token, seq) is None:
            self._ack(record)  # ran since the copy was made: nothing waits any more
            return
        for replaced in self.book.defer(Deferred(key, token, seq, record)):
            self._ack(replaced.record)
        if self.loaded and self.book.next_deferred(key) is not None:
            self._spawn(self._drain(key))  # back from a requeue, or its key released: its turn

    async def defer(self, message: AbstractIncomingMessage, key: str, token: str) -> None:
        """Keep ``message`` behind ``key`` in the order queue (confirmed, read back), then ack
        it. A redelivery of one already kept is only acked."""
        if not (message.redelivered and self.book.is_deferred(key, token)):
            if self.book.held() >= HELD_LIMIT:
                raise OrderQueueFullError(
                    f"{self.order_queue!r} holds {HELD_LIMIT} records: message "
                    f"{message.message_id} of waiting key {key!r} goes back to its queue until "
                    "the keys ahead of it are released"
                )
            headers = sanitize_headers(message.headers)
            headers.update({X_ORDER_RECORD: _DEFERRED, X_ORDER_SEQ: self.book.next_seq()})
            await self._publish_and_read_back(
                _DEFERRED, token, headers, body=message.body, properties=message.properties
            )
        await message.ack()

    async def record_block(self, key: str, token: str, due_at: datetime) -> None:
        """Key ``key`` waits for ``token`` until ``due_at``: confirmed and read back. Written
        at each retry, so that the block always says the message's latest due time."""
        headers = {
            X_ORDER_RECORD: _BLOCK,
            X_ORDER_KEY: key,
            X_ORDER_TOKEN: token,
            X_ORDER_SEQ: self.book.next_seq(),
            X_DUE_AT: to_epoch_ms(due_at),
        }
        await self._publish_and_read_back(_BLOCK, token, headers)

    def wait_in_memory(self, key: str, token: str) -> None:
        """``key`` waits for ``token``, gone back to its queue: in memory (a crash delivers
        it again anyway); released when it runs, or ``release_after`` from now."""
        if key not in self.book.blocks:
            now_ms = to_epoch_ms(utcnow())
            self.book.block(Block(key, token, now_ms, self.book.next_seq(), None))

    async def released(self, block: Block[Record]) -> None:
        """``block``'s message ran for good (or is gone): ack the block, run what waited
        behind its key. The caller holds the key's lock."""
        self._ack(block.record)
        await self.drain_held(block.key)

    async def _drain(self, key: str) -> None:
        async with self.locks.hold(key):
            await self.drain_held(key)

    async def drain_held(self, key: str) -> None:
        """Run the messages waiting behind ``key`` in order until one leaves for the chain
        (its key waits for it again) or goes back to the order queue (its key waits for it in
        memory until it is back). The caller holds the key's lock."""
        while not self.lost and (deferred := self.book.next_deferred(key)) is not None:
            message = IncomingMessage(deferred.record, no_ack=False)
            for name in (X_ORDER_RECORD, X_ORDER_SEQ, _REFRESHED):  # the record's own headers
                message.headers.pop(name, None)
            self._running.add(deferred.token)
            try:
                outcome = await self.run(message)
            finally:
                self._running.discard(deferred.token)
            self.book.done(deferred)
            self._held_since.pop(id(deferred.record), None)
            if outcome == "requeued":
                self.wait_in_memory(key, deferred.token)
            elif outcome == "done":
                block = self.book.unblock(key, deferred.token)
                if block is not None:
                    self._ack(block.record)
            if outcome != "done":
                return

    async def _sweep(self) -> None:
        """Release the keys whose blocker is overdue: it was purged or discarded."""
        grace_ms = int(self.release_after * 1000)
        while True:
            await asyncio.sleep(min(1.0, self.release_after))
            for key in self.book.overdue(to_epoch_ms(utcnow()), grace_ms):
                if key not in self._releasing:
                    self._releasing.add(key)
                    self._spawn(self._release_overdue(key, grace_ms))

    async def _release_overdue(self, key: str, grace_ms: int) -> None:
        try:
            async with self.locks.hold(key):
                block = self.book.blocks.get(key)
                if block is None or key not in self.book.overdue(to_epoch_ms(utcnow()), grace_ms):
                    return  # released meanwhile: its message came back
                log.warning(
                    "key %r of queue %r waited %.0f s past the due time of message %s, which "
                    "did not come back (purged or discarded from the chain?); releasing the key",
                    key,
                    self.queue,
                    self.release_after,
                    block.token,
                )
                self.book.unblock(key)
                await self.released(block)
        finally:
            self._releasing.discard(key)

    async def _refresh(self) -> None:
        """Replace each record held :data:`REFRESH_AFTER` seconds by a fresh copy."""
        while True:
            await asyncio.sleep(REFRESH_AFTER / 2)
            cutoff = time.monotonic() - REFRESH_AFTER
            for entry in list(self.book.records()):
                record = entry.record
                if record is None or self._held_since.get(id(record), cutoff) > cutoff:
                    continue
                if entry.token in self._running:
                    continue  # running now: acked or handed over in a moment
                headers = dict(record.header.properties.headers or {})
                headers[_REFRESHED] = True
                await self._publish(
                    headers=headers, body=record.body, properties=record.header.properties
                )

    async def _publish_and_read_back(
        self,
        kind: str,
        token: str,
        headers: dict[str, Any],
        *,
        body: bytes = b"",
        properties: Basic.Properties | None = None,
    ) -> None:
        """Publish a record, confirmed, and wait until it is delivered back (in the book)."""
        arrived = self._arrival(kind, token)
        try:
            await self._publish(headers=headers, body=body, properties=properties)
            await asyncio.wait_for(asyncio.shield(arrived), _ARRIVAL_TIMEOUT)
        except TimeoutError:
            raise PublishTimeoutError(
                f"a {kind} record of {self.order_queue!r} was confirmed but not delivered back "
                f"within {_ARRIVAL_TIMEOUT:.0f} s"
            ) from None
        finally:
            if self._arrivals.get((kind, token)) is arrived:
                del self._arrivals[(kind, token)]

    async def _publish(
        self,
        *,
        headers: dict[str, Any],
        body: bytes = b"",
        properties: Basic.Properties | None = None,
    ) -> None:
        """Publish a record to the order queue, persistent, with the source's properties."""
        channel = self.channel
        if channel is None or self.lost:
            raise ConnectionError(f"the order channel of {self.order_queue!r} is closed")
        await publish_confirmed(
            channel,
            exchange="",
            routing_key=self.order_queue,
            body=body,
            properties=copy_properties(properties, headers),
            timeout=self.publish_timeout,
        )

    def _arrival(self, kind: str, token: str) -> asyncio.Future[None]:
        arrival = self._arrivals[(kind, token)] = asyncio.get_running_loop().create_future()
        return arrival

    def _arrived(self, kind: str, token: str) -> None:
        arrival = self._arrivals.pop((kind, token), None)
        if arrival is not None and not arrival.done():
            arrival.set_result(None)

    def _ack(self, record: Record | None) -> None:
        if record is None:  # a wait kept in memory only
            return
        self._held_since.pop(id(record), None)
        channel = self.channel
        if channel is not None and not channel.is_closed and record.delivery_tag is not None:
            _detached(channel.basic_ack(record.delivery_tag))

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("ordering of %r failed", self.order_queue, exc_info=task.exception())


class KeyLocks:
    """One lock per key while anything holds or waits for it; FIFO, so arrival order holds."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def take(self, key: str) -> asyncio.Lock:
        """``key``'s lock, counted as used until :meth:`give_back`; taken with no await
        before it, deliveries queue for their key in the order they arrived."""
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
        """Hold ``key``'s lock for the block."""
        lock = self.take(key)
        try:
            async with lock:
                yield
        finally:
            self.give_back(key)


def _detached(work: Awaitable[Any]) -> None:
    """Run ``work`` on its own; its failure (a closed channel) is read and dropped."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark ``future``'s exception as seen: nobody may be left to await it."""
    if not future.cancelled():
        future.exception()
