"""Settling a message after the library itself failed while handling it.

A declaration the broker refused, a channel without confirms, a bug: the
handler's own failures go through the policy, these do not. The message is
parked as ``internal-error`` when the parking queue is known declared and the
channel confirms publishes; otherwise (or if that parking fails too) it is
requeued after a pause that grows with each such message in a row, so nothing
is lost and a queue of them does not spin.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.consumer.failures import FailureHandling
from delayed_retry.consumer.handover import channel_open
from delayed_retry.headers.retry_state import RetryState, parse_retry_state

__all__ = ["rescue"]

log = logging.getLogger(__name__)


async def rescue(
    message: AbstractIncomingMessage,
    exc: BaseException,
    *,
    failures: FailureHandling,
    read_state: Callable[[], RetryState],
) -> None:
    """Settle ``message`` after the library failed with ``exc``: park it, else requeue it later.

    ``read_state`` reads the message's retry state for the parking record; if
    the headers cannot be read, the record is written without them.
    """
    queue = failures.queue
    log.error(
        "delayed-retry failed while handling message %s from queue %r",
        message.message_id,
        queue,
        exc_info=exc,
    )
    if message.processed:
        return
    if not channel_open(message):
        log.warning(
            "the channel of message %s is closed; the broker will deliver it again",
            message.message_id,
        )
        return
    channel = message.channel
    declared = declarer_for(channel.connection).has_destination(
        failures.topology, queue, failures.parking_queue
    )
    if declared and getattr(channel, "publisher_confirms", False):
        try:
            state = read_state()
        except Exception:  # headers unreadable: park with the record alone
            state = parse_retry_state(
                None, exchange=message.exchange, routing_key=message.routing_key, queue=queue
            )
        try:
            await failures.park_now(message, state, exc, "internal-error")
            return
        except Exception as park_err:
            log.error(
                "could not park message %s after an internal error (%r)",
                message.message_id,
                park_err,
            )
    await failures.requeue_after_backoff(message, exc)
