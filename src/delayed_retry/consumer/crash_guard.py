"""The crash guard acted out: a redelivered message is counted, then put back or parked.

Every return to the queue the library chooses (the throttle's, a shutdown's, a hold's
release) is a confirmed copy plus an ack (:mod:`delayed_retry.consumer.put_back`),
so the broker never marks those ``redelivered``. A delivery that is marked so
was therefore held by a consumer that went away without settling it: its
process died, or its connection or channel was lost. :func:`guard_redelivery`
counts it in the message (``x-retry-crashes``): below the guard's
``max_crashes`` a copy with the new count goes back to the queue's tail and
the original is acked, so the count survives the next crash; at
``max_crashes`` the message is parked as ``crashed`` before its handler runs
again, and the parking alert fires like any other.

``redelivered`` rather than ``x-delivery-count``: classic queues have only
the flag, and which returns the count includes differs by version (4.0–4.2
count every return, 4.3 a ``reject`` but not a ``nack``).
"""

from __future__ import annotations

import logging

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.consumer.failures import FailureHandling
from delayed_retry.consumer.put_back import put_back
from delayed_retry.errors import MessageCrashedError
from delayed_retry.headers.names import X_RETRY_CRASHES
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.recovery.crash_guard import CrashGuard, crashes_of

__all__ = ["guard_redelivery"]

log = logging.getLogger(__name__)


async def guard_redelivery(
    message: AbstractIncomingMessage,
    state: RetryState,
    *,
    guard: CrashGuard,
    failures: FailureHandling,
) -> None:
    """Count one crash for the redelivered ``message``; park it at the limit, else put it back.

    Raises when the parking record or the copy cannot be confirmed (the
    caller's rescue path then parks or gives the message back later).
    """
    crashes = crashes_of(message.headers) + 1
    queue = failures.queue
    if crashes >= guard.max_crashes:
        exc = MessageCrashedError(
            f"message {message.message_id} on queue {queue!r} was being handled {crashes} "
            "time(s) when its consumer went away (the process died or lost its connection); "
            "parked before its handler runs again"
        )
        await failures.park_now(message, state, exc, "crashed", extra={X_RETRY_CRASHES: crashes})
        return
    log.warning(
        "message %s on queue %r came back from a consumer that went away while handling it "
        "(crash %d of %d before it is parked); putting it back at the tail of the queue",
        message.message_id,
        queue,
        crashes,
        guard.max_crashes,
    )
    await put_back(
        message,
        queue,
        topology=failures.topology,
        publish_timeout=failures.publish_timeout,
        extra_headers={X_RETRY_CRASHES: crashes},
    )
