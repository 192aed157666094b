"""``consume``: start consuming a queue with a retrying handler, refusing what would lose messages.

Checks before the first message, not at the first failure: the handler is
wrapped and meant for this queue, the queue is not consumed with ``no_ack``,
aio-pika would restore the consumer after a reconnect, and the channel
confirms publishes. Then it declares what the queue needs and warns about a
delivery limit that could drop messages before they are parked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.amqp.consumers import check_restorable, start_consumer
from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.delivery_limits import warn_about_delivery_limit
from delayed_retry.errors import ConfigurationError
from delayed_retry.work_queues import dead_letter_target

__all__ = ["consume"]


async def consume(
    queue: AbstractQueue,
    handler: RetryingHandler[[AbstractIncomingMessage]],
    **consume_kwargs: Any,
) -> str:
    """Consume ``queue`` with ``handler``, telling it the queue so retries come back here.

    Declares the topology, the queue's binding and its parking queue first,
    so a misconfiguration fails here and not at the first failure (and the
    dead-letter queue a queue declared with
    :func:`~delayed_retry.work_queues.work_queue_arguments` names), and warns
    when the queue's delivery limit (as declared through ``queue``) could drop
    messages before they are parked (:mod:`delayed_retry.delivery_limits`). Refuses a
    queue whose consumer aio-pika's robust channel would not restore after a
    reconnect (taken with ``get_queue(..., ensure=False)``): take it with
    ``channel.declare_queue(name, passive=True)``. Returns the consumer tag.
    """
    if not isinstance(handler, RetryingHandler):
        raise ConfigurationError(
            f"{handler!r} is not wrapped with @with_delayed_retry; decorate it first"
        )
    if handler.options.queue not in (None, queue.name):
        raise ConfigurationError(
            f"{handler!r} was configured for queue {handler.options.queue!r} but is consuming "
            f"{queue.name!r}; drop queue= from the decorator or consume the queue it names"
        )
    if consume_kwargs.get("no_ack"):
        raise ConfigurationError(
            f"consume({queue.name!r}, {handler!r}, no_ack=True) is refused: the broker forgets a "
            "no-ack message on delivery, so a failure could not be retried or parked without "
            "losing it; drop no_ack=True"
        )
    check_restorable(queue)
    bound = handler.for_queue(queue.name)
    # A queue declared with work_queue_arguments: its dead-letter queue is declared with it.
    target = dead_letter_target(getattr(queue, "arguments", None))
    if target is not None:
        bound = RetryingHandler(bound.fn, replace(bound.options, dead_letter_queue=target))
    underlay = await underlay_channel(queue.channel)
    if not getattr(underlay, "publisher_confirms", False):
        # Every hand-over would fail on its first failure and leave the message unacked.
        raise ConfigurationError(
            f"queue {queue.name!r} is consumed on a channel without publisher confirms, so "
            f"{handler!r} could never know a retry was handed over; open the channel with "
            "connection.channel(publisher_confirms=True), aio-pika's default"
        )
    await bound.declare(queue.channel)
    warn_about_delivery_limit(
        queue=queue.name,
        arguments=getattr(queue, "arguments", None),
        max_retries=handler.options.policy.max_retries,
        server_properties=getattr(underlay.connection, "server_properties", None),
    )
    return (await start_consumer(queue, bound, **consume_kwargs)).tag
