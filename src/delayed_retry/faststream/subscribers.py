"""What the FastStream middleware reads of a subscriber: its queue, its ack policy, its retrier.

A subscriber runs the middlewares of its broker and of every router it sits in,
outermost first (FastStream 0.7), so its retrier is the last
:class:`~delayed_retry.faststream.DelayedRetry` in that list.
"""

from __future__ import annotations

import logging
from typing import Any

from faststream.middlewares import AckPolicy

from delayed_retry.errors import ConfigurationError

__all__ = [
    "AckPolicyRefusedError",
    "SUPPORTED_ACK_POLICIES",
    "ack_policy_of",
    "check_ack_policy",
    "check_restorable",
    "middlewares_of",
    "queue_name_of",
    "unrestorable_queue_problem",
    "warn_about_unrestorable_queue",
]

log = logging.getLogger(__name__)

SUPPORTED_ACK_POLICIES = frozenset(
    {AckPolicy.REJECT_ON_ERROR, AckPolicy.NACK_ON_ERROR, AckPolicy.ACK, AckPolicy.MANUAL}
)
"""The ack policies a retrying subscriber may have. ``ACK_FIRST`` consumes with
``no_ack``: the broker forgets the message on delivery, so a failure cannot be retried."""


class AckPolicyRefusedError(ConfigurationError):
    """A retrying subscriber's ack policy makes at-least-once retries impossible."""


def middlewares_of(subscriber: Any) -> tuple[Any, ...]:
    """The broker and router middlewares a subscriber runs, outermost first."""
    return tuple(getattr(subscriber, "_broker_middlewares", ()) or ())


def ack_policy_of(subscriber: Any) -> AckPolicy:
    """The ack policy FastStream applies to ``subscriber`` (its own, its broker's, the default)."""
    policy = getattr(subscriber, "ack_policy", AckPolicy.REJECT_ON_ERROR)
    return policy if isinstance(policy, AckPolicy) else AckPolicy(policy)


def queue_name_of(subscriber: Any) -> str:
    """The name of the queue ``subscriber`` consumes, with its broker's and routers' prefix."""
    declared = getattr(subscriber, "_queue_obj", None)
    if declared is not None and getattr(declared, "name", None):
        return str(declared.name)
    queue = subscriber.queue
    config = getattr(subscriber, "_outer_config", None)
    prefix = getattr(config, "prefix", "") or ""
    return f"{prefix}{queue.name}"


def check_ack_policy(subscriber: Any, queue: str) -> None:
    """Refuse a subscriber whose ack policy cannot give at-least-once delayed retries."""
    policy = ack_policy_of(subscriber)
    if policy not in SUPPORTED_ACK_POLICIES:
        raise AckPolicyRefusedError(
            f"the subscriber of queue {queue!r} uses ack_policy=AckPolicy.{policy.name}, which "
            "consumes with no_ack: the broker forgets each message on delivery, so "
            "DelayedRetry could not retry or park a failure without losing it; use "
            "AckPolicy.REJECT_ON_ERROR (the default) or AckPolicy.NACK_ON_ERROR"
        )


def unrestorable_queue_problem(subscriber: Any, queue: str) -> str | None:
    """What goes wrong after a reconnect with ``subscriber``'s queue, or ``None``.

    FastStream declares a subscriber's queue through aio-pika's robust channel,
    which consumes it again after a reconnect unless the queue says
    ``robust=False``.
    """
    if getattr(getattr(subscriber, "queue", None), "robust", True) is not False:
        return None
    return (
        f"the subscriber of queue {queue!r} declares it with RabbitQueue(..., robust=False), "
        "so after a reconnect (broker restart, connection closed) nothing consumes it again "
        "and its retries pile up; drop robust=False"
    )


def check_restorable(subscriber: Any, queue: str) -> None:
    """Refuse a subscriber whose queue would not be consumed again after a reconnect."""
    problem = unrestorable_queue_problem(subscriber, queue)
    if problem is not None:
        raise ConfigurationError(problem)


def warn_about_unrestorable_queue(subscriber: Any, queue: str) -> None:
    """Warn, at its first message, about a subscriber a reconnect would leave unconsumed."""
    problem = unrestorable_queue_problem(subscriber, queue)
    if problem is not None:
        log.warning("%s", problem)


def warn_about_telemetry_order(stack: tuple[Any, ...], retrier: object, queue: str) -> None:
    """Warn when a FastStream telemetry middleware is listed after the retrier."""
    after = stack[stack.index(retrier) + 1 :]
    if any(type(m).__name__.endswith("TelemetryMiddleware") for m in after):
        log.warning(
            "queue %r: RabbitTelemetryMiddleware is listed after DelayedRetry, so each attempt "
            "gets two consumer spans; list it before DelayedRetry in middlewares=[...]",
            queue,
        )
