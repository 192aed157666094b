"""The one at-least-once hand-over: confirm the copy, then ack the original.

Every consumer the library runs (the decorator, the router, the forwarder,
the front door) moves a message on through :func:`hand_over`: the copy's
publish must be confirmed before the original is acked. An unconfirmed
publish is tried again, the original unacked, with tenacity's bounded
exponential backoff (:class:`HandOverTiming`); past its window the message
is requeued, never in a tight loop. Why, and what the broker counts, is in
``docs/reliability.md``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiormq
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.errors import PublishError

__all__ = [
    "DEFAULT_TIMING",
    "HANDOVER_RETRY_WINDOW",
    "RETRYABLE",
    "HandOverTiming",
    "RequeueBackoff",
    "ack",
    "channel_open",
    "hand_over",
    "requeue",
    "requeue_after_backoff",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

HANDOVER_RETRY_WINDOW = 30.0
"""Seconds a failed hand-over is tried again, original unacked, before it is requeued."""
HANDOVER_FIRST_PAUSE = 0.5
HANDOVER_MAX_PAUSE = 8.0
REQUEUE_FIRST_PAUSE = 0.5
"""Seconds a message is kept before it is requeued after the first internal failure."""
REQUEUE_MAX_PAUSE = 30.0
"""The longest such pause; it doubles with each message requeued in a row."""

RETRYABLE: tuple[type[BaseException], ...] = (
    PublishError,
    aiormq.exceptions.AMQPError,
    ConnectionError,
)
"""Failures of a publish that may pass: the hand-over tries again."""

_NO_CALL = tenacity.Retrying()
"""The retry object tenacity's call states name; the hand-over's tries are its own loop."""


@dataclass(frozen=True, kw_only=True)
class HandOverTiming:
    """How long and how often an unconfirmed hand-over is tried before the message goes back,
    and how long a message that could not be handled is kept before it goes back.

    Built once per consumer and passed to :func:`hand_over` and
    :func:`requeue_after_backoff`: a consumer that must give up sooner passes
    its own instead of the defaults.
    """

    window: float = HANDOVER_RETRY_WINDOW
    first_pause: float = HANDOVER_FIRST_PAUSE
    max_pause: float = HANDOVER_MAX_PAUSE
    requeue_first_pause: float = REQUEUE_FIRST_PAUSE
    requeue_max_pause: float = REQUEUE_MAX_PAUSE

    @functools.cached_property
    def pause(self) -> tenacity.wait.wait_base:
        """The pause before the next try of an unconfirmed hand-over: doubling, bounded."""
        return tenacity.wait_exponential(multiplier=self.first_pause, max=self.max_pause)

    @functools.cached_property
    def give_up(self) -> tenacity.stop.stop_base:
        """Whether to stop trying a hand-over: its next pause would end past ``window``."""
        return tenacity.stop_before_delay(self.window)

    @functools.cached_property
    def requeue_pause(self) -> tenacity.wait.wait_base:
        """The pause before a requeue, by messages requeued in a row: doubling, bounded."""
        return tenacity.wait_exponential(
            multiplier=self.requeue_first_pause, max=self.requeue_max_pause
        )


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
    was not acked: requeued after ``timing.window`` seconds of failures, or
    left to the broker because the consuming channel closed (it redelivers the
    message). Any other exception of ``publish`` propagates, the message
    unsettled: the caller requeues it after a pause (:func:`requeue_after_backoff`).
    """
    tries: tenacity.RetryCallState | None = None
    while True:
        try:
            result = await publish()
        except RETRYABLE as err:
            if tries is None:  # built at the first failure: a confirmed publish needs none
                tries = tenacity.RetryCallState(_NO_CALL, None, (), {})
            else:
                tries.attempt_number += 1
            tries.outcome_timestamp = time.monotonic()
            tries.upcoming_sleep = pause = timing.pause(tries)
            if not channel_open(message):
                log.warning(
                    "hand-over of message %s from queue %r failed (%s) and its channel is "
                    "closed; the broker will deliver it again",
                    message.message_id,
                    queue,
                    err,
                )
                return None
            if timing.give_up(tries):
                log.error(
                    "could not hand over message %s from queue %r (%s); returning it to the queue",
                    message.message_id,
                    queue,
                    err,
                )
                await requeue(message)
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
            continue
        await ack(message, queue)
        return result


@dataclass(eq=False)
class RequeueBackoff:
    """How many messages a consumer requeued in a row, unhandled: sets the next pause.

    One per consumer; :meth:`reset` after each message handled, so a run of
    failures backs off (0.5 s, 1 s, ... 30 s) and one success starts again.
    """

    in_a_row: int = 0

    def reset(self) -> None:
        self.in_a_row = 0

    def next_pause(self, timing: HandOverTiming = DEFAULT_TIMING) -> float:
        """The pause before the next requeue; counts it."""
        requeues = tenacity.RetryCallState(_NO_CALL, None, (), {})
        requeues.attempt_number = self.in_a_row + 1
        self.in_a_row += 1
        return timing.requeue_pause(requeues)


async def requeue_after_backoff(
    message: AbstractIncomingMessage,
    queue: str,
    err: BaseException,
    backoff: RequeueBackoff,
    *,
    timing: HandOverTiming = DEFAULT_TIMING,
) -> None:
    """Keep ``message`` for a pause that grows with ``backoff``, then :func:`requeue` it.

    For failures no retry of a publish can fix (a broker refusing
    declarations, a channel without confirms): the consumer keeps going, and
    the pause keeps a queue of such messages from spinning.
    """
    pause = backoff.next_pause(timing)
    log.error(
        "message %s from queue %r could not be handled or parked (%r); returning it "
        "to the queue in %.1f s",
        message.message_id,
        queue,
        err,
        pause,
    )
    await asyncio.sleep(pause)
    await requeue(message)


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


async def requeue(message: AbstractIncomingMessage) -> None:
    """Return ``message`` to its queue now (``nack``, requeue).

    Use it for a message the library can neither keep nor move on (a hand-over
    that was never confirmed, a wait cut short by a shutdown). The broker counts
    the return (``redelivered``, and toward a quorum queue's delivery limit on
    RabbitMQ 4.0-4.2); a return that is the library's choice, not the message's
    fault, is a put-back instead (:func:`~delayed_retry.consumer.put_back.put_back`).
    ``nack`` rather than ``reject``: RabbitMQ 4.3 counts a ``reject`` toward
    the delivery limit and not a ``nack``.
    """
    try:
        await message.nack(requeue=True)
    except Exception as err:  # channel gone: the broker redelivers it anyway
        log.info(
            "could not nack message %s (%r); the broker will deliver it again",
            message.message_id,
            err,
        )
