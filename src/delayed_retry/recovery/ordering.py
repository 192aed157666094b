"""Order per key, the pure half: which key waits for which message, and what waits behind it.

A consumer with ``ordered_by=`` keeps, for each partition it holds, an
:class:`OrderBook`: the keys whose message is waiting in the chain for a retry
(the *blocker*, known by its :func:`order_token`), and the later messages of
those keys (*deferred*, in the order they arrived). A message of a blocked key
that is not its blocker waits behind it; when the blocker succeeds or parks, or
is overdue (purged or discarded from the chain), the key is released and what
waits behind it runs in order. The broker half is
:mod:`delayed_retry.consumer.ordering`; the book is rebuilt from the partition's
order queue whenever a consumer takes the partition over.
"""

from __future__ import annotations

import bisect
import hashlib
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from delayed_retry.headers.names import is_broker_header

__all__ = ["Block", "Deferred", "OrderBook", "order_token", "partition_for"]

R = TypeVar("R")
"""The broker's handle of a record (a delivery to ack); the book only keeps it."""


def partition_for(key: str, partitions: int) -> int:
    """The partition (0 to ``partitions - 1``) of messages with ``key``: CRC-32 of its UTF-8
    bytes, modulo ``partitions``. Any language computes the same (zlib's ``crc32``)."""
    if partitions < 1:
        raise ValueError(f"partitions={partitions!r} must be at least 1")
    return zlib.crc32(key.encode()) % partitions


def order_token(message_id: str | None, body: bytes, headers: Mapping[str, object]) -> str:
    """What identifies a message across its retries and redeliveries: its ``message_id``,
    else a digest of its body and its own headers (not the broker's, which a redelivery
    changes). Two messages of one key alike in all of these are taken for one: give
    messages a ``message_id``."""
    if message_id:
        return f"id:{message_id}"
    digest = hashlib.sha256(body)
    for name in sorted(headers):
        if not is_broker_header(name.lower()):
            digest.update(f"\0{name}={headers[name]!r}".encode())
    return f"sha256:{digest.hexdigest()[:32]}"


@dataclass(frozen=True)
class Block(Generic[R]):
    """Key ``key`` waits for the message with ``token``, due back at ``due_ms``.

    ``record`` is ``None`` for a wait kept in memory only: a message gone back to its queue
    (it is delivered again), which a crash would deliver again anyway.
    """

    key: str
    token: str
    due_ms: int
    seq: int
    record: R | None


@dataclass(frozen=True)
class Deferred(Generic[R]):
    """A message of a blocked key, held in the order queue until its turn (``seq`` order)."""

    key: str
    token: str
    seq: int
    record: R


@dataclass
class OrderBook(Generic[R]):
    """The keys of one partition that wait, and what waits behind them.

    Records carry a sequence number per partition: a takeover sorts what it read
    back by it, whatever order the broker returned the records in.
    """

    blocks: dict[str, Block[R]] = field(default_factory=dict)
    deferred: dict[str, list[Deferred[R]]] = field(default_factory=dict)
    last_seq: int = 0
    _waiting: int = 0

    def next_seq(self) -> int:
        """A sequence number above every record of the partition."""
        self.last_seq += 1
        return self.last_seq

    def must_wait(self, key: str, token: str) -> bool:
        """Whether a message of ``key`` with ``token`` waits: its key is blocked by another
        message, or earlier messages of its key still wait to run."""
        block = self.blocks.get(key)
        if block is not None:
            return block.token != token
        return bool(self.deferred.get(key))

    def is_deferred(self, key: str, token: str) -> bool:
        """Whether a message with ``token`` already waits behind ``key`` (a redelivery)."""
        return any(d.token == token for d in self.deferred.get(key, ()))

    def block(self, block: Block[R]) -> list[Block[R]]:
        """Record ``block``; the records it replaces (to ack), older ones of the same key."""
        self.last_seq = max(self.last_seq, block.seq)
        old = self.blocks.get(block.key)
        if old is not None and old.seq > block.seq:
            return [block]  # read back out of order: the later one stands
        self.blocks[block.key] = block
        return [] if old is None else [old]

    def unblock(self, key: str, token: str | None = None) -> Block[R] | None:
        """Release ``key`` (if ``token`` is given, only from that blocker); its block."""
        block = self.blocks.get(key)
        if block is None or (token is not None and block.token != token):
            return None
        return self.blocks.pop(key)

    def defer(self, deferred: Deferred[R]) -> list[Deferred[R]]:
        """Keep ``deferred`` behind its key, in sequence order; the entries it replaces (to
        ack): a fresh copy of a record replaces the one held (same token and sequence)."""
        self.last_seq = max(self.last_seq, deferred.seq)
        waiting = self.deferred.setdefault(deferred.key, [])
        for index, held in enumerate(waiting):
            if held.token == deferred.token and held.seq == deferred.seq:
                waiting[index] = deferred
                return [held]
        bisect.insort(waiting, deferred, key=lambda d: d.seq)
        self._waiting += 1
        return []

    def find(self, key: str, token: str, seq: int) -> Deferred[R] | None:
        """The waiting entry of ``key`` with ``token`` and ``seq``, if it still waits."""
        return next(
            (d for d in self.deferred.get(key, ()) if d.token == token and d.seq == seq), None
        )

    def next_deferred(self, key: str) -> Deferred[R] | None:
        """The earliest message waiting behind ``key``: if its key is not blocked, or is
        blocked by that very message (gone back to the order queue, and now back)."""
        waiting = self.deferred.get(key)
        if not waiting:
            return None
        block = self.blocks.get(key)
        return waiting[0] if block is None or block.token == waiting[0].token else None

    def done(self, deferred: Deferred[R]) -> None:
        """``deferred`` ran (or left): it no longer waits."""
        waiting = self.deferred.get(deferred.key, [])
        if deferred in waiting:
            waiting.remove(deferred)
            self._waiting -= 1
        if not waiting:
            self.deferred.pop(deferred.key, None)

    def overdue(self, now_ms: int, grace_ms: int) -> list[str]:
        """The keys whose blocker is ``grace_ms`` past its due time: gone from the chain."""
        return [key for key, block in self.blocks.items() if now_ms > block.due_ms + grace_ms]

    def ready_keys(self) -> Iterator[str]:
        """Keys with messages waiting and no blocker: what a takeover or a release runs."""
        return (key for key in list(self.deferred) if key not in self.blocks)

    def held(self) -> int:
        """Records held: the blocks and the messages waiting behind them."""
        return len(self.blocks) + self._waiting

    def waiting(self) -> int:
        """Messages waiting behind a blocked key, in all."""
        return self._waiting

    def records(self) -> Iterator[Block[R] | Deferred[R]]:
        """Every block and waiting message held with a record of the broker's."""
        yield from (block for block in self.blocks.values() if block.record is not None)
        for waiting in self.deferred.values():
            yield from waiting
