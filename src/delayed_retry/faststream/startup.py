"""Checking a FastStream application's subscribers at start-up, before any message is consumed.

Apart from :mod:`delayed_retry.faststream.subscribers` (what one subscriber
may be) because it needs the middleware's type to find the subscribers it
serves, and the middleware needs those per-subscriber checks.
"""

from __future__ import annotations

from typing import Any

from delayed_retry.faststream.middleware import DelayedRetry
from delayed_retry.faststream.subscribers import (
    check_ack_policy,
    check_restorable,
    middlewares_of,
    queue_name_of,
    warn_about_telemetry_order,
)

__all__ = ["check_subscribers"]


def check_subscribers(broker: Any) -> int:
    """Check every subscriber of ``broker`` (and its routers) that a ``DelayedRetry`` serves.

    Call it in the application's start-up hook (``@app.on_startup``), after the
    subscribers are registered: an ``ACK_FIRST`` ack policy or a ``robust=False``
    queue then fails the start, before any message is consumed, instead of at
    the first message (``docs/faststream.md`` says what happens then). Also warns
    about a telemetry middleware listed after the retrier. Returns how many
    subscribers were checked.
    """
    checked = 0
    for subscriber in getattr(broker, "subscribers", ()):
        stack = middlewares_of(subscriber)
        retriers = [m for m in stack if isinstance(m, DelayedRetry)]
        if not retriers:
            continue
        queue = queue_name_of(subscriber)
        check_ack_policy(subscriber, queue)
        check_restorable(subscriber, queue)
        retriers[-1].options.topology.check_destination(queue)
        warn_about_telemetry_order(stack, retriers[-1], queue)
        checked += 1
    return checked
