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
    subscribers are registered: a forbidden ack policy then fails the start,
    before any message is consumed. Without it the middleware refuses such a
    subscriber at its first message: it handles nothing, and each message
    ``ACK_FIRST`` takes from the queue is put back through the chain, due two
    seconds later, round again until the application is fixed.
    A queue declared with ``robust=False`` fails it too: after a reconnect
    nothing would consume it again. Also warns when FastStream's telemetry
    middleware runs inside the retrier (listed after it): each attempt would
    then get two consumer spans.
    Returns how many subscribers were checked.
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
