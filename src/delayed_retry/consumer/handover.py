"""The one at-least-once hand-over: confirm the copy, then ack the original.

Every consumer the library runs (the decorator, the router, the forwarder,
the front door) moves a message on through :func:`hand_over`:

1. ``publish`` puts the message's next home in place (a retry copy in the
   chain, a parking record, a delivery to an exchange) and returns once the
   broker confirmed it;
2. only then is the original acked. If the process dies in between, the
   original is redelivered and the copy also arrives: a duplicate, never a loss.

While the publish is not confirmed (a nack, a timeout, a channel error, a
missing exchange), the original stays unacked and the publish is tried again
after a pause that doubles (``0.5 s`` … ``8 s``) for up to
:data:`HANDOVER_RETRY_WINDOW` seconds; only then is the message given back to
its queue (``nack`` with requeue), at most once per window: never in a tight
loop. Each give-back is one delivery toward a quorum queue's delivery limit,
which is why every queue the library consumes is declared with
:data:`~delayed_retry.topology.DELIVERY_LIMIT`. See ``docs/reliability.md``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiormq
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.errors import PublishError

__all__ = [
    "DEFAULT_TIMING",
    "HANDOVER_RETRY_WINDOW",
    "RETRYABLE",
    "HandOverTiming",
    "Trouble",
    "ack",
    "channel_open",
    "give_back",
    "give_back_later",
    "hand_over",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

HANDOVER_RETRY_WINDOW = 30.0
"""Seconds a failed hand-over is tried again, original unacked, before it is given back."""
HANDOVER_FIRST_PAUSE = 0.5
HANDOVER_MAX_PAUSE = 8.0
REQUEUE_FIRST_PAUSE = 0.5
"""Seconds a message is kept before it is given back after the first internal failure."""
REQUEUE_MAX_PAUSE = 30.0
"""The longest such pause; it doubles with each message given back in a row."""

RETRYABLE: tuple[type[BaseException], ...] = (
    PublishError,
    aiormq.exceptions.AMQPError,
    ConnectionError,
)
"""Failures of a publish that may pass: the hand-over tries again."""


@dataclass(frozen=True, kw_only=True)
class HandOverTiming:
    """How long and how often an unconfirmed hand-over is tried before the message goes back,
    and how long a message that could not be handled is kept before it goes back.

    Built once per consumer and passed to :func:`hand_over` and
    :func:`give_back_later`; tests pass short ones instead of the defaults.
    """

    window: float = HANDOVER_RETRY_WINDOW
    first_pause: float = HANDOVER_FIRST_PAUSE
    max_pause: float = HANDOVER_MAX_PAUSE
    requeue_first_pause: float = REQUEUE_FIRST_PAUSE
    requeue_max_pause: float = REQUEUE_MAX_PAUSE


DEFAULT_TIMING = HandOverTiming()
"""The timing every consumer uses unless it is given another."""


async def hand_over(
    message: AbstractIncomingMessage,
    publish: Callable[[], Awaitable[_T]],
    *,
    queue: str,
    timing: HandOverTiming = DEFAULT_TIMING,
) -> _T | None:
    """Run ``publish`` until the broker confirms it, then ack ``message``; return its result.

    Use it wherever a consumed message moves on: ``publish`` must raise (one
    of :data:`RETRYABLE`) unless its copy is confirmed, must be safe to run
    again, and returns what the caller needs back, never ``None`` (return
    ``True`` when there is nothing to say). Returns ``None`` when the message
    was not acked: given back to ``queue`` after ``timing.window`` seconds of
    failures, or left to the broker because the consuming channel closed (it
    redelivers the message). Any other exception of ``publish`` propagates,
    the message unsettled: the caller gives it back after a pause
    (:func:`give_back_later`).
    """
    started = time.monotonic()
    pause = timing.first_pause
    while True:
        try:
            result = await publish()
        except RETRYABLE as err:
            if not channel_open(message):
                log.warning(
                    "hand-over of message %s from queue %r failed (%s) and its channel is "
                    "closed; the broker will deliver it again",
                    message.message_id,
                    queue,
                    err,
                )
                return None
            if time.monotonic() - started + pause > timing.window:
                await give_back(message, queue, err)
                return None
            log.warning(
                "hand-over of message %s from queue %r was not confirmed (%s); keeping it "
                "unacked and trying again in %.1f s",
                message.message_id,
                queue,
                err,
                pause,
            )
            await asyncio.sleep(pause)
            pause = min(pause * 2, timing.max_pause)
            continue
        await ack(message, queue)
        return result


@dataclass(eq=False)
class Trouble:
    """Messages given back in a row without a handling in between: sets the next pause."""

    given_back: int = 0

    def clear(self) -> None:
        self.given_back = 0

    def next_pause(self, timing: HandOverTiming = DEFAULT_TIMING) -> float:
        pause = min(
            timing.requeue_first_pause * 2.0 ** min(self.given_back, 30), timing.requeue_max_pause
        )
        self.given_back += 1
        return pause


async def give_back_later(
    message: AbstractIncomingMessage,
    queue: str,
    err: BaseException,
    trouble: Trouble,
    *,
    timing: HandOverTiming = DEFAULT_TIMING,
) -> None:
    """Keep ``message`` for a pause that grows with ``trouble``, then give it back.

    For failures no retry of a publish can fix (a broker refusing
    declarations, a channel without confirms): the consumer keeps going, and
    the pause keeps a queue of such messages from spinning.
    """
    pause = trouble.next_pause(timing)
    log.error(
        "message %s from queue %r could not be handled or parked (%r); returning it "
        "to the queue in %.1f s",
        message.message_id,
        queue,
        err,
        pause,
    )
    await asyncio.sleep(pause)
    await give_back(message, queue, err)


def channel_open(message: AbstractIncomingMessage) -> bool:
    """Whether the channel ``message`` came on is still open (it can still be settled)."""
    try:
        channel = message.channel  # aio-pika raises once the channel is closed
    except Exception:
        return False
    return not getattr(channel, "is_closed", True)


async def ack(message: AbstractIncomingMessage, queue: str) -> None:
    """Ack a handled or handed-over message; a failure only means a duplicate later."""
    try:
        await message.ack()
    except Exception as err:  # done or handed over; the original will be redelivered
        log.warning(
            "message %s on queue %r was handled or handed over but could not be acked (%r); "
            "it will be delivered again (a duplicate, not a loss)",
            message.message_id,
            queue,
            err,
        )


async def give_back(message: AbstractIncomingMessage, queue: str, err: BaseException) -> None:
    """Return a message that could not be handed over to its queue (``nack``, requeue).

    ``nack`` rather than ``reject``: RabbitMQ 4.3 counts a ``reject`` toward a
    quorum queue's delivery limit and not a ``nack``.
    """
    log.error(
        "could not hand over message %s from queue %r (%s); returning it to the queue",
        message.message_id,
        queue,
        err,
    )
    try:
        await message.nack(requeue=True)
    except Exception as nack_err:  # channel gone: the broker redelivers it anyway
        log.warning(
            "could not nack message %s (%r); the broker will redeliver it",
            message.message_id,
            nack_err,
        )
