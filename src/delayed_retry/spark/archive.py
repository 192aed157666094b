"""Drain a parking queue into Parquet: ack only what a durable file already holds.

The archiver needs no JVM: it reads with aio-pika and writes with pyarrow.
Messages are taken in batches (the channel's prefetch); each batch is
written as one part file per day, and only after every file is durable is
the batch acked with one ``multiple=True`` ack up to its last delivery tag.
A crash or a failing write leaves the batch unacked, so the broker hands it
out again: duplicates at worst (same ``message_key``), never a loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from delayed_retry.amqp.consumers import start_consumer
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import utcnow
from delayed_retry.errors import (
    ConfigurationError,
    DelayedRetryError,
    parking_queue_not_found,
    queue_not_found,
)
from delayed_retry.headers.names import (
    X_ACQUIRED_COUNT,
    X_DELIVERY_COUNT,
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TRACEBACK,
    X_EXCEPTION_TYPE,
    X_PARKED_AT,
    X_PARKED_REASON,
    X_QUEUE,
    X_RETRY,
)
from delayed_retry.headers.retry_state import parse_retry_state, read_epoch_ms
from delayed_retry.headers.text import header_text
from delayed_retry.spark.codec import headers_to_json, message_key
from delayed_retry.spark.schema import archive_arrow_schema, escape_partition_value
from delayed_retry.spark.sinks import ArchiveSink, sink_for

__all__ = [
    "ArchiveError",
    "ArchiveResult",
    "archive_queue",
    "archive_row",
    "archive",
]

COUNTED_BY_BROKER = (X_DELIVERY_COUNT, X_ACQUIRED_COUNT)
"""Headers the broker rewrites on each redelivery: never part of a message's identity."""

log = logging.getLogger(__name__)


class ArchiveError(DelayedRetryError):
    """Archiving stopped; messages not yet in a durable file were left in the queue."""


@dataclass(frozen=True, kw_only=True)
class ArchiveResult:
    """What one archive run did."""

    queue: str
    messages: int
    files: tuple[str, ...] = field(default=())


def _origin_queue(
    headers: Mapping[str, Any], exchange: str, routing_key: str, topology: DelayTopology
) -> str | None:
    # The parking exchange's routing key is the queue that gave up: the broker routed
    # by it, so it is preferred to a header. Foreign messages fall back to x-retry-queue.
    if exchange == topology.parking_exchange and routing_key:
        return routing_key
    return header_text(headers.get(X_QUEUE)) or None


def archive_row(
    *,
    body: bytes,
    headers: Mapping[str, Any] | None,
    exchange: str,
    routing_key: str,
    properties: Mapping[str, Any],
    redelivered: bool,
    archived_at: datetime,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
) -> dict[str, Any]:
    """One archive row (schema :data:`~delayed_retry.spark.schema.ARCHIVE_COLUMNS`). Pure."""
    h: Mapping[str, Any] = headers if isinstance(headers, Mapping) else {}
    headers_json = headers_to_json(h)
    # The broker's counters change on each redelivery; leave them out of the key so
    # a redelivered duplicate keeps the key of the first copy.
    key_json = headers_to_json({k: v for k, v in h.items() if k not in COUNTED_BY_BROKER})
    state = parse_retry_state(h, exchange=exchange, routing_key=routing_key, queue=None)
    has_retries = X_RETRY in h or state.broker_deaths > 0
    return {
        "message_key": message_key(exchange, routing_key, key_json, body),
        "body": body,
        "headers_json": headers_json,
        "exchange": exchange,
        "routing_key": routing_key,
        "origin_queue": _origin_queue(h, exchange, routing_key, topology),
        "content_type": header_text(properties.get("content_type")),
        "content_encoding": header_text(properties.get("content_encoding")),
        "message_id": header_text(properties.get("message_id")),
        "correlation_id": header_text(properties.get("correlation_id")),
        "retries": state.retries if has_retries else None,
        "parked_reason": header_text(h.get(X_PARKED_REASON)),
        "exception_type": header_text(h.get(X_EXCEPTION_TYPE)),
        "exception_message": header_text(h.get(X_EXCEPTION_MESSAGE)),
        "exception_traceback": header_text(h.get(X_EXCEPTION_TRACEBACK)),
        "last_error": state.last_error,
        "first_failure_at": state.first_failure_at,
        "last_failure_at": state.last_failure_at,
        "parked_at": read_epoch_ms(h.get(X_PARKED_AT)),
        "archived_at": archived_at,
        "redelivered": redelivered,
    }


def _row_of(
    message: AbstractIncomingMessage, archived_at: datetime, topology: DelayTopology
) -> dict[str, Any]:
    return archive_row(
        body=message.body,
        headers=message.headers,
        exchange=message.exchange or "",
        routing_key=message.routing_key or "",
        properties={
            "content_type": message.content_type,
            "content_encoding": message.content_encoding,
            "message_id": message.message_id,
            "correlation_id": message.correlation_id,
        },
        redelivered=bool(message.redelivered),
        archived_at=archived_at,
        topology=topology,
    )


def _write_batch(sink: ArchiveSink, queue: str, rows: list[dict[str, Any]]) -> list[str]:
    import pyarrow as pa

    by_day: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        day = (row["parked_at"] or row["archived_at"]).strftime("%Y-%m-%d")
        by_day.setdefault(day, []).append(row)
    schema = archive_arrow_schema()
    files = []
    for day, day_rows in sorted(by_day.items()):
        table = pa.Table.from_pylist(day_rows, schema=schema)
        relative = f"date={day}/queue={escape_partition_value(queue)}"
        files.append(sink.write(table, relative))
    return files


async def archive_queue(
    connection: AbstractConnection,
    *,
    queue: str,
    to: str | ArchiveSink,
    batch_size: int = 1000,
    idle_timeout: float = 1.0,
    max_messages: int | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    clock: Callable[[], datetime] = utcnow,
) -> ArchiveResult:
    """Drain ``queue`` (a parking queue) into Parquet files under ``to``; return what was done.

    Use it to empty a parking queue after an incident while keeping every
    message for analysis and redrive. It stops when the queue has been empty
    for ``idle_timeout`` seconds or after ``max_messages``. ``to`` is a local
    folder, a URI pyarrow reaches (``s3://…``), or an :class:`ArchiveSink`.
    Messages are acked only after the file holding them is durable; on any
    error the unacked rest stays in the queue and :class:`ArchiveError` says why.
    """
    if not 1 <= batch_size <= 65535:
        raise ConfigurationError(f"batch_size={batch_size} must be within 1..65535")
    if max_messages is not None and max_messages < 1:
        raise ConfigurationError(f"max_messages={max_messages} must be at least 1")
    sink = sink_for(to) if isinstance(to, str) else to
    channel = await connection.channel(publisher_confirms=False)
    files: list[str] = []
    archived = 0
    try:
        await channel.set_qos(prefetch_count=batch_size)
        try:
            source = await channel.declare_queue(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            missing = (
                parking_queue_not_found(queue)
                if queue.endswith(".parking")
                else queue_not_found(queue, so="there is nothing to archive")
            )
            raise ArchiveError(missing) from exc
        inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        consumer = await start_consumer(source, inbox.put, no_ack=False)
        try:
            while max_messages is None or archived < max_messages:
                want = batch_size
                if max_messages is not None:
                    want = min(want, max_messages - archived)
                batch: list[AbstractIncomingMessage] = []
                while len(batch) < want:
                    try:
                        batch.append(await asyncio.wait_for(inbox.get(), idle_timeout))
                    except TimeoutError:
                        break
                if not batch:
                    break
                now = clock()
                rows = [_row_of(m, now, topology) for m in batch]
                try:
                    written = await asyncio.to_thread(_write_batch, sink, queue, rows)
                except Exception as exc:
                    raise ArchiveError(
                        f"writing {len(rows)} messages of queue {queue!r} failed: {exc}; "
                        f"they stay in the queue ({archived} archived before); fix the "
                        "target and run the archive again"
                    ) from exc
                # The files are durable: ack the whole batch at once.
                await batch[-1].ack(multiple=True)
                files.extend(written)
                archived += len(batch)
                log.info("archived %d messages of %r (%d so far)", len(batch), queue, archived)
        finally:
            await consumer.cancel()
    finally:
        # Closing the channel hands every unacked message back to the queue.
        with contextlib.suppress(Exception):
            await channel.close()
    return ArchiveResult(queue=queue, messages=archived, files=tuple(files))


async def archive(url: str, *, queue: str, to: str | ArchiveSink, **options: Any) -> ArchiveResult:
    """:func:`archive_queue` on a connection of its own to ``url``."""
    connection = await aio_pika.connect(url, timeout=60)
    try:
        return await archive_queue(connection, queue=queue, to=to, **options)
    finally:
        await connection.close()
