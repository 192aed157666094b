"""Seeing whether a replay's canaries park again.

A replay with ``canary=N`` sends its first N copies with a token (see
:class:`~delayed_retry.parking.moves.CanarySlots`) and asks a
:class:`CanaryLookout` whether a copy with that token parks again before a
deadline (how long is :mod:`~delayed_retry.parking.canary_wait`'s to say).
The lookout watches the parking exchange through a private queue
(:class:`ParkWatch`); where that exchange cannot be bound, it scans the
parking queue instead (:func:`scan_for_canary`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.amqp.channels import close_quietly
from delayed_retry.amqp.declare import underlay_of
from delayed_retry.durations import utcnow
from delayed_retry.headers import X_REPLAY_CANARY
from delayed_retry.parking.scan import own_channel, queue_depth, take

__all__ = ["WATCH_EXPIRES_MS", "CanaryLookout", "ParkWatch", "scan_for_canary"]

log = logging.getLogger(__name__)

WATCH_EXPIRES_MS = 15 * 60 * 1000
"""A canary watch queue left unused this long is deleted by the broker."""


async def scan_for_canary(
    channel: Any, parking: str, token: str, *, deadline: float, poll: float
) -> bool:
    """Whether a copy carrying ``token`` parks again before ``deadline`` (loop time).

    Reads the whole parking queue on each poll: the fallback when no
    :class:`ParkWatch` can be opened.
    """
    loop = asyncio.get_running_loop()
    while True:
        async with own_channel(channel, confirms=False) as own:
            await queue_depth(own, parking)
            async for _got, record in take(own, parking, asked_at=utcnow()):
                if record.headers.get(X_REPLAY_CANARY) == token:
                    return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(min(poll, max(deadline - loop.time(), 0)))


class ParkWatch:
    """A private queue bound to the parking exchange: sees every message parked for a queue.

    Canaries are recognised there as they park again, without scanning the
    parking queue (which may hold thousands of messages). It gets copies:
    taking them changes nothing in the parking queue.
    """

    def __init__(self, channel: aiormq.abc.AbstractChannel, name: str) -> None:
        self._channel = channel
        self._name = name

    @classmethod
    async def open(cls, channel: Any, *, exchange: str, queue: str) -> ParkWatch | None:
        """Start watching; ``None`` when the parking exchange cannot be bound (not ours)."""
        underlay = await underlay_of(channel)
        # Kept open while watching (not a scratch channel): close() deletes the queue on it.
        own = await underlay.connection.channel(publisher_confirms=False)
        try:
            # Deleted by close(); exclusive and x-expires remove it too if close() never runs.
            declared = await own.queue_declare(
                "",
                exclusive=True,
                arguments={"x-queue-type": "classic", "x-expires": WATCH_EXPIRES_MS},
            )
            await own.queue_bind(declared.queue or "", exchange, routing_key=queue)
        except aiormq.exceptions.ChannelClosed:
            log.info(
                "cannot watch parking exchange %r; canaries are looked for by scanning", exchange
            )
            await close_quietly(own)
            return None
        return cls(own, declared.queue or "")

    async def parked_again(self, token: str, *, deadline: float, poll: float) -> bool:
        """Whether a copy carrying ``token`` parks before ``deadline`` (loop time)."""
        loop = asyncio.get_running_loop()
        while True:
            got = await self._channel.basic_get(self._name, no_ack=True)
            if got.delivery_tag is not None:
                headers = got.header.properties.headers or {}
                if headers.get(X_REPLAY_CANARY) == token:
                    return True
                continue
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(min(poll, max(deadline - loop.time(), 0)))

    async def close(self) -> None:
        """Stop watching and delete the private queue (its copies are of no further use)."""
        if self._channel.is_closed:
            return
        try:
            await self._channel.queue_delete(self._name)
        finally:
            await close_quietly(self._channel)


class CanaryLookout:
    """Answers whether a replay's canaries parked again before a deadline.

    Open it with :meth:`opened` around the replay: it watches the parking
    exchange while the replay runs (before the rest and after it) and deletes
    its watch queue afterwards.
    """

    def __init__(
        self,
        channel: Any,
        *,
        parking: str,
        watch: ParkWatch | None,
        poll: float,
    ) -> None:
        self._channel = channel
        self._parking = parking
        self._watch = watch
        self._poll = poll

    @classmethod
    @asynccontextmanager
    async def opened(
        cls,
        channel: Any,
        *,
        exchange: str,
        target: str,
        parking: str,
        poll: float,
    ) -> AsyncIterator[CanaryLookout]:
        """A lookout for copies replayed to ``target`` that park again (through ``exchange``).

        ``poll`` is how often to look.
        """
        watch = await ParkWatch.open(channel, exchange=exchange, queue=target)
        try:
            yield cls(channel, parking=parking, watch=watch, poll=poll)
        finally:
            if watch is not None:
                await watch.close()

    async def parked_again(self, token: str, until: float) -> bool:
        """Whether a copy carrying ``token`` parks again before ``until`` (loop time).

        A copy that parked earlier and was not seen yet counts too.
        """
        if self._watch is not None:
            return await self._watch.parked_again(token, deadline=until, poll=self._poll)
        return await scan_for_canary(
            self._channel, self._parking, token, deadline=until, poll=self._poll
        )
