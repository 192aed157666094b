"""Queues whose keys keep their order across retries: declared in partitions, published by key.

Use :func:`declare_ordered_queues` once (a deploy step, or at start-up) and
:func:`publish_ordered` to send; consume every partition with a handler given
``ordered_by=`` (:mod:`delayed_retry.consumer.ordering`). Each partition is a
single-active-consumer queue: several consumer processes may consume all of
them, and each partition is handled by one process at a time, the others
standing by to take it over. A key always goes to the same partition
(:func:`~delayed_retry.recovery.ordering.partition_for`: CRC-32 of the key
modulo the partitions), so any language can publish to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractQueue

from delayed_retry.consumer.order_partition import ORDER_QUEUE_ARGUMENTS, order_queue_name
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.names import X_ORDER_KEY
from delayed_retry.rabbitmq.work_queues import work_queue_arguments
from delayed_retry.recovery.ordering import partition_for

__all__ = ["declare_ordered_queues", "ordered_queue_names", "publish_ordered"]


def ordered_queue_names(queue: str, partitions: int = 1) -> list[str]:
    """The partitions of ``queue``: ``queue`` itself for one, else ``queue.0`` to ``queue.N-1``."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigurationError(f"partitions={partitions!r} must be a positive int")
    if partitions == 1:
        return [queue]
    return [f"{queue}.{index}" for index in range(partitions)]


async def declare_ordered_queues(
    channel: AbstractChannel,
    queue: str,
    *,
    partitions: int = 1,
    arguments: Mapping[str, Any] | None = None,
) -> list[AbstractQueue]:
    """Declare ``queue``'s partitions and their order queues.

    Each partition is a work queue (:func:`~delayed_retry.work_queue_arguments`: quorum,
    a delivery limit whose excess goes to ``<partition>.dead-letter``) with a single active
    consumer; ``arguments`` are added to each partition's. Returns the partitions, to
    consume each with :func:`~delayed_retry.consume`.
    """
    declared = []
    for name in ordered_queue_names(queue, partitions):
        own = {**work_queue_arguments(name), "x-single-active-consumer": True}
        declared.append(
            await channel.declare_queue(name, durable=True, arguments={**own, **(arguments or {})})
        )
        await channel.declare_queue(
            order_queue_name(name), durable=True, arguments=ORDER_QUEUE_ARGUMENTS
        )
    return declared


async def publish_ordered(
    channel: AbstractChannel,
    message: aio_pika.Message,
    *,
    queue: str,
    key: str,
    partitions: int = 1,
) -> None:
    """Publish ``message`` with ``key`` to the partition of ``queue`` that keeps ``key``'s order.

    The key travels in the ``x-retry-order-key`` header, which the consumer reads
    before ``ordered_by``. Messages of one key are kept in the order they are
    published by one publisher; on a channel with publisher confirms (aio-pika's
    default) this waits for the broker's confirm.
    """
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"key={key!r} must be a non-empty str")
    names = ordered_queue_names(queue, partitions)
    message.headers[X_ORDER_KEY] = key
    await channel.default_exchange.publish(
        message, routing_key=names[partition_for(key, partitions)], mandatory=True
    )
