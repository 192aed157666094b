"""``consume``: start consuming a queue with a retrying handler, refusing what would lose messages.

Checks before the first message, not at the first failure: the handler is
wrapped and meant for this queue, the queue is not consumed with ``no_ack``
and aio-pika would restore its consumer after a reconnect; then the start-up
check every retrying consumer shares (:func:`~delayed_retry.consumer.startup.check_start`:
publisher confirms, and a warning about a delivery limit that could drop messages).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.amqp.consumers import check_restorable, start_consumer
from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.consumer.startup import ConsumerStart, check_start
from delayed_retry.errors import ConfigurationError

__all__ = ["consume"]


async def consume(
    queue: AbstractQueue,
    handler: RetryingHandler[[AbstractIncomingMessage]],
    **consume_kwargs: Any,
) -> str:
    """Consume ``queue`` with ``handler``, telling it the queue so retries come back here.

    Use it rather than ``queue.consume(handler)``: it declares the topology, the
    queue's binding and its parking queue (and the dead-letter queue of a queue
    declared with :func:`~delayed_retry.rabbitmq.work_queues.work_queue_arguments`), so a
    misconfiguration fails here and not at the first failure. A queue taken with
    ``get_queue(..., ensure=False)`` is refused: take it with
    ``channel.declare_queue(name, passive=True)``. Returns the consumer tag.
    """
    _check_handler(queue, handler, no_ack=bool(consume_kwargs.get("no_ack")))
    check_restorable(queue)
    underlay = await underlay_channel(queue.channel)
    arguments = getattr(queue, "arguments", None)
    target = check_start(
        ConsumerStart(
            consumer=repr(handler),
            queue=queue.name,
            topology=handler.options.topology,
            returns_to=(queue.name,),
            confirms=bool(getattr(underlay, "publisher_confirms", False)),
            arguments=arguments,
            max_retries=handler.options.policy.max_retries,
            server_properties=getattr(underlay.connection, "server_properties", None),
        )
    )
    _check_ordered(queue, handler, arguments)
    bound = handler.for_queue(queue.name)
    if target is not None:
        bound = RetryingHandler(bound.fn, replace(bound.options, dead_letter_queue=target))
    await bound.declare(queue.channel)
    return (await start_consumer(queue, bound, **consume_kwargs)).tag


def _check_handler(queue: AbstractQueue, handler: object, *, no_ack: bool) -> None:
    """Refuse a handler that is not wrapped, is meant for another queue, or runs with no_ack."""
    if not isinstance(handler, RetryingHandler):
        raise ConfigurationError(
            f"{handler!r} is not wrapped with @with_delayed_retry; decorate it first"
        )
    if handler.options.queue not in (None, queue.name):
        raise ConfigurationError(
            f"{handler!r} was configured for queue {handler.options.queue!r} but is consuming "
            f"{queue.name!r}; drop queue= from the decorator or consume the queue it names"
        )
    if no_ack:
        raise ConfigurationError(
            f"consume({queue.name!r}, {handler!r}, no_ack=True) is refused: the broker forgets a "
            "no-ack message on delivery, so a failure could not be retried or parked without "
            "losing it; drop no_ack=True"
        )


def _check_ordered(queue: AbstractQueue, handler: RetryingHandler[Any], arguments: object) -> None:
    """Refuse ``ordered_by`` on a queue known not to be single-active-consumer."""
    if handler.options.ordering is None or not isinstance(arguments, dict):
        return  # not ordered, or declared passively: its arguments are not known here
    if not arguments.get("x-single-active-consumer"):
        raise ConfigurationError(
            f"queue {queue.name!r} is consumed with ordered_by= but was not declared with "
            "x-single-active-consumer: two consumers could run one key's messages at once; "
            "declare it with delayed_retry.declare_ordered_queues"
        )
