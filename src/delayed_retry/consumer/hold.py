"""Messages held in memory until their due time: counted, bounded, releasable.

A message that left the chain a little early (see :mod:`delayed_retry.recovery.hold`)
waits here, unacked, for the rest of its delay. Released on shutdown (or by
:meth:`HeldUntilDue.release`), it is requeued (``nack``, requeue), so nothing
is lost; a closed channel returns it anyway. Without a hold, a message a little
early (:func:`early_tolerance`) is handled at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Literal

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.handover import requeue
from delayed_retry.consumer.waits import Waits
from delayed_retry.durations import utcnow
from delayed_retry.recovery.hold import Hold

__all__ = ["EARLY_TOLERANCE", "HeldUntilDue", "Outcome", "early_tolerance", "hold_until_due"]

log = logging.getLogger(__name__)


class HeldUntilDue(Waits):
    """The messages one handler (and its copies for other queues) holds right now."""

    __slots__ = ("stopping",)

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False
        """Set by :meth:`release`: the consumer is shutting down and takes nothing new."""

    hold = Waits.wait

    def release(self) -> int:
        """End every hold now (each message goes back to its queue); returns how many.

        For a shutdown: from now on :attr:`stopping` is true.
        """
        self.stopping = True
        return super().release()


Outcome = Literal["due", "early", "released"]
"""What :func:`hold_until_due` did: waited until due, found the message too early to hold
(send it back into the chain), or requeued it (released or cancelled)."""

_ZERO = timedelta(0)
_US = timedelta(microseconds=1)

EARLY_TOLERANCE = timedelta(milliseconds=50)
"""Without a hold, a message arriving at most this much before its due time is handled
now, and never less than one unit of the topology (see :func:`early_tolerance`); one
arriving earlier is sent back for the rest of the wait."""


def early_tolerance(topology: DelayTopology) -> timedelta:
    """Without a hold, how early a message may arrive and be handled now: 50 ms, or one unit.

    Sending back a message due in less than one unit would cost it a whole
    unit more in the chain (delays are rounded up to units).
    """
    return max(EARLY_TOLERANCE, timedelta(milliseconds=topology.unit_ms))


async def hold_until_due(
    held: HeldUntilDue,
    hold: Hold | None,
    message: AbstractIncomingMessage,
    due_at: datetime,
    *,
    max_delay: timedelta,
    tolerance: timedelta = _ZERO,
    put_back: Callable[[AbstractIncomingMessage], Awaitable[object]] | None = None,
) -> Outcome:
    """Keep ``message`` until ``due_at`` if ``hold`` allows; say what became of it.

    ``"early"``: more than ``hold.limit`` early, or ``hold.max_messages`` are
    held already; the caller sends it back into the chain. ``"released"``: it
    was requeued (``nack``, requeue). A due time beyond
    ``max_delay`` (no chain sets one) counts as due. Cancelled while holding,
    it requeues the message and lets the cancellation through. ``put_back``
    replaces the requeue of a released message (the crash guard's put-back,
    which the broker does not mark ``redelivered``). With no
    ``hold``, nothing is held: a message at most ``tolerance`` early is due,
    an earlier one ``"early"``.
    """
    while True:
        early = due_at - utcnow()
        if early <= _ZERO or early > max_delay:
            return "due"
        if hold is None:
            return "due" if early <= tolerance else "early"
        if early // _US > hold.limit_us or len(held) >= hold.max_messages:
            return "early"
        try:
            due = await held.hold(early.total_seconds())
        except asyncio.CancelledError:
            await requeue(message)  # shutting down (a closed channel returns it too)
            raise
        if not due:
            log.info(
                "message %s released before its due time; back to its queue", message.message_id
            )
            await (put_back or requeue)(message)
            return "released"
        # Due by the loop's clock; check the wall clock the due time was set with.
