"""Putting a message back in its queue without a redelivery: a confirmed copy, then an ack.

``nack`` with requeue returns a message to its queue, but the broker counts
that return: RabbitMQ 4.0–4.2 count every return toward a quorum queue's
delivery limit (20 by default, then the message is dropped), 4.3 counts a
``reject``, and the next delivery carries ``redelivered`` (and a higher
``x-delivery-count``), which the crash guard reads as "the process holding it
died". :func:`put_back` instead publishes a copy to the tail of the queue
through the default exchange and acks the original once the copy is
confirmed (the one hand-over, :func:`~delayed_retry.consumer.handover.hand_over`):
a fresh message, counted by no version, at the cost of its place in the
queue. Use it for every return that is the library's choice, not the
message's fault.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.amqp import publish
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.handover import hand_over
from delayed_retry.headers.names import X_ORIGINAL_EXCHANGE, X_ORIGINAL_ROUTING_KEY
from delayed_retry.headers.values import sanitize_headers

log = logging.getLogger(__name__)

__all__ = ["cancel_consumer_of", "put_back", "put_back_headers"]


def put_back_headers(
    message: AbstractIncomingMessage, topology: DelayTopology, extra: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The copy's headers: the message's own, its first route kept, plus ``extra``.

    The copy arrives through the default exchange; the exchange and routing
    key of its first delivery are kept in the headers the retry state reads,
    so a later retry or parking record still names them.
    """
    headers = sanitize_headers(message.headers)
    exchange = message.exchange or ""
    if X_ORIGINAL_EXCHANGE not in headers and exchange and not topology.is_chain_exchange(exchange):
        headers[X_ORIGINAL_EXCHANGE] = exchange
        headers[X_ORIGINAL_ROUTING_KEY] = message.routing_key or ""
    if extra:
        headers.update(extra)
    return headers


async def put_back(
    message: AbstractIncomingMessage,
    queue: str,
    *,
    topology: DelayTopology,
    publish_timeout: float,
    extra_headers: Mapping[str, Any] | None = None,
) -> bool:
    """Put ``message`` back at the tail of ``queue`` as a new message; ``True`` once acked.

    ``False`` when the copy could not be confirmed within the hand-over's
    window: the original was then requeued with ``nack`` (counted as a
    return by the broker), or is left to the broker because its channel closed.
    """
    headers = put_back_headers(message, topology, extra_headers)

    async def publish_it() -> bool:
        await publish.publish_copy(
            message.channel,
            message,
            exchange="",
            routing_key=queue,
            headers=headers,
            timeout=publish_timeout,
        )
        return True

    return await hand_over(message, publish_it, queue=queue) is not None


async def cancel_consumer_of(message: AbstractIncomingMessage) -> None:
    """Cancel the consumer that delivered ``message``, if it still consumes (``basic.cancel``).

    For a consumer that is shutting down but was not cancelled first: without
    it, every message put back would come straight back to it.
    """
    tag = message.consumer_tag
    if tag is None:
        return
    with contextlib.suppress(Exception):  # a closed channel has no consumer left
        channel = message.channel
        if tag in getattr(channel, "consumers", {}):
            log.warning(
                "consumer %r delivered message %s after its shutdown began; cancelling it",
                tag,
                message.message_id,
            )
            await channel.basic_cancel(tag)
