"""The pauses between immediate runs of a delivery: bounded, releasable, requeued on shutdown.

While a handler waits to run a message again (see
:class:`~delayed_retry.recovery.immediate.ImmediateRetries`), the message is unacked.
A consumer that stops must not lose it nor run it again on a closed channel:
released (:meth:`Pauses.release`, called by
:meth:`~delayed_retry.consumer.handler.RetryingHandler.release_held`) or
cancelled, the pause requeues the message (``nack``, requeue; no delayed
retry spent) and the handler does not run again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.consumer.handover import channel_open, requeue
from delayed_retry.consumer.waits import Waits

__all__ = ["Pauses", "pause_before_rerun"]

log = logging.getLogger(__name__)


class Pauses(Waits):
    """The pauses one handler (and its copies for other queues) is in right now."""

    __slots__ = ()

    pause = Waits.wait


async def pause_before_rerun(
    pauses: Pauses,
    message: AbstractIncomingMessage,
    seconds: float,
    *,
    queue: str,
    put_back: Callable[[AbstractIncomingMessage], Awaitable[object]] | None = None,
) -> bool:
    """Pause, then say whether the handler may run ``message`` again.

    ``False`` when the pause was released, or when the channel closed meanwhile
    (the broker delivers the message again elsewhere: running it here would be
    a second handling of a message this process can no longer settle). Cancelled,
    it requeues the message and lets the cancellation through. ``put_back``
    replaces the requeue of a released message (the crash guard's put-back,
    which the broker does not mark ``redelivered``).
    """
    if seconds > 0:
        try:
            due = await pauses.pause(seconds)
        except asyncio.CancelledError:
            await requeue(message)  # a closed channel returns it too
            raise
        if not due:
            log.info(
                "message %s on queue %r released between immediate retries; back to its queue",
                message.message_id,
                queue,
            )
            await (put_back or requeue)(message)
            return False
    if not channel_open(message):
        log.warning(
            "the channel of message %s on queue %r closed between immediate retries; the "
            "broker will deliver it again",
            message.message_id,
            queue,
        )
        return False
    return True
