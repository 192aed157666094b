"""A user's work queue, the queue a retrying consumer reads: the arguments and the policy that
defend it against messages the AMQP client cannot decode, and where it dead-letters. Pure.

Use :func:`work_queue_arguments` when declaring a new work queue and
:func:`work_queue_policy_command` for one that exists; :func:`dead_letter_target` reads back
what they set up. The delay chain's own queues are :mod:`delayed_retry.chain.topology`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delayed_retry.chain.topology import DelayTopology, QueueArguments, amqp_arguments
from delayed_retry.errors import ConfigurationError
from delayed_retry.rabbitmq.policies import BrokerPolicy, regex_literal

__all__ = [
    "WORK_QUEUE_DELIVERY_LIMIT",
    "dead_letter_target",
    "work_queue_arguments",
    "work_queue_policy_command",
]


WORK_QUEUE_DELIVERY_LIMIT = 5
"""``x-delivery-limit`` :func:`work_queue_arguments` gives a queue a retrying consumer reads.

A message the AMQP client cannot decode (a timestamp past the year 9999, a
header name that is not UTF-8: docs/reliability.md lists them) drops the
consumer's connection at each delivery, before any code of the consumer sees
it; the broker returns it and delivers it again, first, for ever. Each such
return counts toward the limit, so after this many the broker dead-letters it
to the queue's dead-letter queue and the messages behind it flow again: with
aio-pika's default reconnect interval of 5 s, in about half a minute. What else
counts, and moves a message there the same way (with the broker's ``x-death``
record): a lost connection or consumer crash while it was in flight, and on
RabbitMQ 3.10-4.2 a hand-over given back after 30 s without a confirm, so five
of those (2.5 minutes of broker trouble for one message) move it.
"""


def work_queue_arguments(
    queue: str,
    *,
    dead_letter_queue: str | None = None,
    delivery_limit: int = WORK_QUEUE_DELIVERY_LIMIT,
) -> dict[str, Any]:
    """The ``x-*`` arguments to declare a queue a retrying consumer reads with.

    Use them when you declare the queue (``channel.declare_queue(queue, durable=True,
    arguments=work_queue_arguments(queue))``, or ``delayed-retry declare --bind QUEUE
    --create``): a quorum queue whose broker dead-letters a message delivered
    more than ``delivery_limit`` times into ``dead_letter_queue`` (default
    ``<queue>.dead-letter``, through the default exchange, at-least-once), which
    :func:`~delayed_retry.consume` declares. That is the one defence against a
    message the AMQP client cannot decode, which no consumer code ever sees (see
    :data:`WORK_QUEUE_DELIVERY_LIMIT`); it goes to a queue of its own, not to the
    parking queue, so that the parking tools, which must decode what they read,
    keep working. A queue that exists already keeps its arguments (the broker
    refuses to change them): set them with a policy there (docs/reliability.md).
    """
    if isinstance(delivery_limit, bool) or not isinstance(delivery_limit, int):
        raise ConfigurationError(
            f"delivery_limit={delivery_limit!r} for queue {queue!r} is not a whole number; "
            f"pass a count of deliveries such as {WORK_QUEUE_DELIVERY_LIMIT}"
        )
    if delivery_limit < 1:
        raise ConfigurationError(
            f"delivery_limit={delivery_limit} for queue {queue!r} would dead-letter messages "
            "at their first return (RabbitMQ 3.10 reads -1 that way too); pass at least 1, "
            f"such as {WORK_QUEUE_DELIVERY_LIMIT}"
        )
    if not queue or queue.startswith("amq."):
        raise ConfigurationError(
            f"queue name {queue!r} cannot be declared by a client; pass the name of your queue"
        )
    target = dead_letter_queue or DelayTopology.default_dead_letter_queue(queue)
    if target == queue:
        raise ConfigurationError(
            f"dead_letter_queue={target!r} is queue {queue!r} itself; pass another queue, or "
            "none for <queue>.dead-letter"
        )
    args: QueueArguments = {
        "x_queue_type": "quorum",
        "x_delivery_limit": delivery_limit,
        "x_dead_letter_exchange": "",
        "x_dead_letter_routing_key": target,
        # At-least-once dead-lettering needs reject-publish; with drop-head the broker
        # silently falls back to at-most-once, which drops a message whose target is missing.
        "x_dead_letter_strategy": "at-least-once",
        "x_overflow": "reject-publish",
    }
    return dict(amqp_arguments(args))


def work_queue_policy_command(
    queue: str,
    *,
    dead_letter_queue: str | None = None,
    delivery_limit: int = WORK_QUEUE_DELIVERY_LIMIT,
    vhost: str = "/",
) -> str:
    """The ``rabbitmqctl set_policy`` giving an existing quorum queue what
    :func:`work_queue_arguments` gives a new one.

    For a queue that exists already, whose arguments the broker will not change.
    A queue takes one policy (the highest priority that matches): fold these
    keys into a policy it already has instead, if it has one. A classic queue
    cannot take them: it has no delivery limit.
    """
    args = work_queue_arguments(
        queue, dead_letter_queue=dead_letter_queue, delivery_limit=delivery_limit
    )
    definition = {
        key.removeprefix("x-"): value for key, value in args.items() if key != "x-queue-type"
    }
    policy = BrokerPolicy(
        name=f"{queue}.work-queue", pattern=f"^{regex_literal(queue)}$", definition=definition
    )
    return policy.command(vhost=vhost)


def dead_letter_target(arguments: object) -> str | None:
    """The queue a queue's arguments dead-letter into through the default exchange, or ``None``.

    That is what :func:`work_queue_arguments` sets up: ``x-dead-letter-exchange``
    empty and ``x-dead-letter-routing-key`` naming the queue. Other targets
    (an exchange of their own) are the owner's to declare.
    """
    if not isinstance(arguments, Mapping):
        return None
    exchange = arguments.get("x-dead-letter-exchange")
    target = arguments.get("x-dead-letter-routing-key")
    if exchange == "" and isinstance(target, str) and target:
        return target
    return None
