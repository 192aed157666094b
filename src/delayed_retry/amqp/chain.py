"""Publish a copy into the delay topology, its declarations ensured and healed.

The one way the library puts a message into the chain (a retry, a redelay of
an early message, a front-door delay, ``publish_delayed``) or one of the
topology's other exchanges (the unroutable exchange): the topology is
declared first (cached per connection), and when the broker answers that an
exchange is missing (the chain was deleted by hand, or by a mistaken
teardown), the connection forgets its declarations so the next try declares
the chain again. The caller's hand-over does that next try.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.amqp.publish import (
    DEFAULT_PUBLISH_TIMEOUT,
    Copyable,
    Publisher,
    copy_properties,
    publish_confirmed,
)
from delayed_retry.chain.topology import DelayTopology, Route
from delayed_retry.errors import PublishError

__all__ = ["publish_into_chain"]


async def publish_into_chain(
    channel: aiormq.abc.AbstractChannel,
    message: Copyable,
    *,
    topology: DelayTopology,
    route: Route | tuple[str, str],
    headers: Mapping[str, Any],
    timeout: float = DEFAULT_PUBLISH_TIMEOUT,
    keep_delivery_mode: bool = False,
    publish: Publisher = publish_confirmed,
) -> None:
    """Publish a persistent copy of ``message`` to ``route`` (exchange, key); wait for the confirm.

    ``keep_delivery_mode`` keeps the producer's delivery mode instead (see
    :func:`~delayed_retry.amqp.publish.copy_properties`). ``publish`` is the
    consumer's publisher (see :class:`~delayed_retry.amqp.publish.Publisher`).

    Raises :class:`~delayed_retry.errors.PublishError` like
    :func:`~delayed_retry.amqp.publish.publish_confirmed`; after a missing-exchange
    refusal the next call re-declares ``topology`` before publishing.
    """
    exchange, routing_key = route[0], route[1]
    connection = channel.connection
    declarer = declarer_for(connection)
    await declarer.topology(connection, topology)
    try:
        # The copy is made here and published in one call: this frame is on every retry's path.
        await publish(
            channel,
            exchange=exchange,
            routing_key=routing_key,
            body=message.body,
            properties=copy_properties(
                message.properties, headers, keep_delivery_mode=keep_delivery_mode
            ),
            timeout=timeout,
        )
    except PublishError as err:
        if isinstance(err.__cause__, aiormq.exceptions.ChannelNotFoundEntity):
            declarer.forget(topology)
        raise
