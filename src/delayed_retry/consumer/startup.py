"""The one start-up check of a consumer that retries: ``consume``, FastStream's ``DelayedRetry``
and :class:`~delayed_retry.RetryRouter` call :func:`check_start` before their first message.
Pure: each caller gathers what it knows of its channel and queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.errors import ConfigurationError
from delayed_retry.rabbitmq.delivery_limits import warn_about_delivery_limit
from delayed_retry.rabbitmq.work_queues import dead_letter_target

__all__ = ["AIO_PIKA_CONFIRMS", "ConsumerStart", "check_start"]

AIO_PIKA_CONFIRMS = (
    "open the channel with connection.channel(publisher_confirms=True), aio-pika's default"
)
"""How to get a channel that confirms publishes, in aio-pika."""


@dataclass(frozen=True, kw_only=True)
class ConsumerStart:
    """A retrying consumer about to take messages from ``queue``, as far as it is known."""

    consumer: str
    """How the error names the consumer (its ``repr``, or ``DelayedRetry``)."""
    queue: str
    topology: DelayTopology
    returns_to: tuple[str, ...]
    """The queues it sends retries back to through the chain."""
    confirms: bool | None
    """Whether its channel confirms publishes; ``None``: no channel yet, or none at all
    (FastStream's in-memory test broker)."""
    confirms_fix: str = AIO_PIKA_CONFIRMS
    arguments: Mapping[str, Any] | None = None
    """The consumed queue's arguments as declared; ``None``: unknown."""
    max_retries: int | None = None
    server_properties: Mapping[str, Any] | None = None
    """The broker's, from the connection: its version decides the default delivery limit."""


def check_start(start: ConsumerStart) -> str | None:
    """Refuse a start that would lose messages and warn about a delivery limit that could.

    Returns the dead-letter queue the consumed queue's arguments name
    (:func:`~delayed_retry.rabbitmq.work_queues.work_queue_arguments`), to be declared with its
    binding, or ``None``.
    """
    for queue in start.returns_to:
        start.topology.check_destination(queue)
    if start.confirms is False:
        # Every hand-over would fail on its first failure and leave the message unacked.
        raise ConfigurationError(
            f"queue {start.queue!r} is consumed on a channel without publisher confirms, so "
            f"{start.consumer} could never know a message was handed over; {start.confirms_fix}"
        )
    warn_about_delivery_limit(
        queue=start.queue,
        arguments=start.arguments,
        max_retries=start.max_retries,
        server_properties=start.server_properties,
    )
    return dead_letter_target(start.arguments)
