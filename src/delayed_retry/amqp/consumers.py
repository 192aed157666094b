"""Consumers that come back after a reconnect, and know whether they are in place.

The one way the library starts a consumer. aio-pika's robust channel
restores, after a reconnect, the consumers of the queues it tracks: those
taken with ``channel.declare_queue(...)`` (passive or not) or
``channel.get_queue(name)``. A queue taken with ``get_queue(name,
ensure=False)``, or declared with ``robust=False``, is not tracked: after a
broker restart or a closed connection nothing consumes it again, while the
Python side still holds its consumer tag. So every consumer the library runs
takes its queue here (:func:`consume_queue`), and a queue handed in by a user
(:func:`~delayed_retry.consume`) is checked here (:func:`check_restorable`).

A :class:`Consumer` answers :attr:`Consumer.in_place` from the channel the
broker talks to now: its consumer tag is registered on the live AMQP channel
(``basic.consume`` sent on it, not cancelled by the broker since). That is
what a readiness probe should read; it also counts how often the consumer
was restored after its channel came back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Container, Coroutine, Iterable
from typing import Any

import aiormq.abc
from aio_pika import RobustChannel
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from delayed_retry.errors import ConfigurationError

__all__ = [
    "Consumer",
    "all_in_place",
    "check_restorable",
    "consume_marker",
    "consume_queue",
    "consume_to_scan",
    "resume_on_broker",
    "start_consumer",
]

log = logging.getLogger(__name__)

Callback = Callable[[AbstractIncomingMessage], Awaitable[Any]]


def _consumer_tags(underlay: aiormq.abc.AbstractChannel) -> Container[str]:
    """Tags of the consumers on an AMQP channel: added at ``basic.consume``, removed when
    cancelled by either side (aiormq's ``Channel.consumers``)."""
    tags: Container[str] = getattr(underlay, "consumers", ())
    return tags


def is_restorable(queue: AbstractQueue) -> bool:
    """Whether a reconnect brings ``queue``'s consumers back (always true off a robust channel).

    A robust channel restores only the queue objects it holds; nothing public
    tells which, so this reads its registry (aio-pika's ``RobustChannel._queues``).
    """
    channel = queue.channel
    if not isinstance(channel, RobustChannel):
        return True  # a plain channel restores nothing: the service sees it closed
    tracked: Iterable[AbstractQueue] = channel._queues.get(queue.name, ())
    return any(known is queue for known in tracked)


def check_restorable(queue: AbstractQueue) -> None:
    """Refuse a queue whose consumer a robust channel would not restore after a reconnect."""
    if not is_restorable(queue):
        raise ConfigurationError(
            f"queue {queue.name!r} was taken in a way aio-pika's robust channel does not "
            "track (get_queue(..., ensure=False) or robust=False), so after a reconnect "
            "nothing would consume it again; take it with "
            f"channel.declare_queue({queue.name!r}, passive=True) or "
            f"channel.get_queue({queue.name!r})"
        )


class Consumer:
    """One consumer the library runs: its queue, its tag, whether the broker has it now.

    Made by :func:`consume_queue` or :func:`start_consumer`; use
    :attr:`in_place` for readiness and :meth:`cancel` to stop it.
    """

    def __init__(self, queue: AbstractQueue, tag: str, underlay: aiormq.abc.AbstractChannel):
        self.queue = queue
        self.tag = tag
        self._underlay: aiormq.abc.AbstractChannel | None = underlay
        self.restored = 0
        """How often the consumer was back in place after its channel reopened."""
        self.lost = 0
        """How often its channel reopened without it (it will not come back by itself)."""
        self.cancelled = False
        reopened = getattr(queue.channel, "reopen_callbacks", None)
        if reopened is not None:
            reopened.add(self._on_reopen)

    def __repr__(self) -> str:
        return f"<Consumer of {self.queue.name!r} {'in place' if self.in_place else 'gone'}>"

    @property
    def in_place(self) -> bool:
        """Whether its ``basic.consume`` stands on the channel the broker talks to now.

        False while the connection or channel is down or being restored, after
        the broker cancelled it (queue deleted, leader lost on some versions),
        and after :meth:`cancel`.
        """
        underlay = self._underlay
        return (
            not self.cancelled
            and underlay is not None
            and not underlay.is_closed
            and self.tag in _consumer_tags(underlay)
        )

    async def _on_reopen(self, channel: Any, *_: Any) -> None:
        # Called by the robust channel after it reopened and restored what it tracks.
        if self.cancelled:
            return
        try:
            underlay: aiormq.abc.AbstractChannel = await channel.get_underlay_channel()
        except Exception:  # closed again already: the next reopen calls back
            self._underlay = None
            return
        self._underlay = underlay
        if self.tag in _consumer_tags(underlay):
            self.restored += 1
            log.info("consumer of %r restored after a reconnect", self.queue.name)
        else:
            self.lost += 1
            log.error(
                "consumer of %r was not restored after a reconnect; the process no longer "
                "consumes it: restart it",
                self.queue.name,
            )

    async def cancel(self) -> None:
        """Stop consuming: no new deliveries; unacked ones stay with the caller until settled."""
        self.cancelled = True
        reopened = getattr(self.queue.channel, "reopen_callbacks", None)
        if reopened is not None:
            reopened.discard(self._on_reopen)
        with contextlib.suppress(Exception):  # channel gone: nothing to cancel
            await self.queue.cancel(self.tag)


async def start_consumer(
    queue: AbstractQueue, callback: Callback, **consume_kwargs: Any
) -> Consumer:
    """Consume ``queue`` (checked restorable, see :func:`check_restorable`) with ``callback``."""
    check_restorable(queue)
    tag = await queue.consume(callback, **consume_kwargs)
    underlay = await queue.channel.get_underlay_channel()
    return Consumer(queue, tag, underlay)


async def consume_queue(
    channel: AbstractChannel, name: str, callback: Callback, **consume_kwargs: Any
) -> Consumer:
    """Consume the existing queue ``name`` on ``channel`` so that a reconnect restores it.

    Use it for every queue the library consumes: the queue is taken with a
    passive declare, which a robust channel tracks (and which fails at once,
    closing only this channel, when the queue does not exist).
    """
    queue = await channel.declare_queue(name, passive=True)
    return await start_consumer(queue, callback, **consume_kwargs)


async def resume_on_broker(
    channel: aiormq.abc.AbstractChannel, queue: str, callback: Any, *, tag: str
) -> None:
    """Register again, with its own tag and callback, a consumer cancelled on the broker only.

    For a pause that cancels a consumer behind aio-pika's back (a throttle):
    the robust queue still holds the consumer, so a reconnect restores it as
    well, and ``channel.consumers`` tells whether that happened already.
    """
    await channel.basic_consume(queue, callback, consumer_tag=tag)


async def consume_marker(channel: aiormq.abc.AbstractChannel, queue: str) -> None:
    """Consume ``queue`` without taking anything from it, only so the broker counts a consumer.

    A marker on a plain channel: it is not restored after a reconnect, and
    whoever reads its consumer count must take that as a lower bound.
    """
    await channel.basic_consume(queue, _ignore, no_ack=True)


async def consume_to_scan(
    channel: aiormq.abc.AbstractChannel,
    queue: str,
    callback: Callable[[aiormq.abc.DeliveredMessage], Coroutine[Any, Any, None]],
) -> str:
    """Consume ``queue`` on a scan's own channel, acks by hand; return the consumer tag.

    For a read that ends with its channel (an operator's scan of the delay
    levels, the records of an ordered partition): deliberately not restored
    after a reconnect, since what a lost channel held goes back to the queue
    and the reader starts again rather than go on with half a view.
    """
    ok = await channel.basic_consume(queue, callback, no_ack=False)
    if ok.consumer_tag is None:
        raise RuntimeError(f"the broker gave no consumer tag for {queue!r}")
    return ok.consumer_tag


async def _ignore(_: Any) -> None:
    """A marker queue's consumer: there is never anything to take."""


def all_in_place(consumers: Iterable[Consumer]) -> bool:
    """Whether there is at least one consumer and every one stands on the live channel."""
    found = list(consumers)
    return bool(found) and all(c.in_place for c in found)
