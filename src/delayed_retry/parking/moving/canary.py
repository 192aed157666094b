"""Watching a replay's canaries: whether a replayed copy parks again.

A replay with ``canary=N`` sends its first N copies with a token (see
:class:`~delayed_retry.parking.moving.canary_rules.CanarySlots`), and its
:class:`Canary` asks a :class:`CanaryLookout` whether a copy with that token parks again
before a deadline (how long is :class:`~delayed_retry.parking.moving.canary_rules.CanaryWait`'s
to say); :class:`CanaryWatch` runs the watch before the rest is replayed and after it.
The lookout watches the parking exchange through a private queue
(:class:`ParkWatch`); where that exchange cannot be bound, it scans the
parking queue instead (:func:`scan_for_canary`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.amqp.channels import close_quietly, underlay_channel
from delayed_retry.durations import utcnow
from delayed_retry.headers.names import X_REPLAY_CANARY
from delayed_retry.parking.moving.canary_rules import (
    CanaryNews,
    CanaryPhase,
    CanarySlots,
    CanaryWait,
)
from delayed_retry.parking.moving.report import (
    CANARY_CONFIRMED,
    CANARY_PARKED_AFTER_THE_REST,
    CANARY_PARKED_AGAIN,
)
from delayed_retry.parking.scan import own_channel, queue_depth, take

__all__ = [
    "WATCH_EXPIRES_MS",
    "Canary",
    "CanaryLookout",
    "CanaryWatch",
    "ParkWatch",
    "scan_for_canary",
]

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
        underlay = await underlay_channel(channel)
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


@dataclass(frozen=True, kw_only=True)
class Canary:
    """A replay's canaries: which copies carry the token, and how to see them park again.

    ``parked_again(token, until)`` answers whether a copy with ``token``
    parks again before ``until`` (loop time). ``wait`` is the operator's
    canary wait in seconds (``None``: derived from the canaries' records, see
    :class:`~delayed_retry.parking.moving.canary_rules.CanaryWait`); ``delay`` when
    the copies come due; ``news`` hears each step.
    """

    slots: CanarySlots
    parked_again: Callable[[str, float], Awaitable[bool]]
    delay: float = 0.0
    wait: float | None = None
    news: Callable[[CanaryNews], None] | None = None


class CanaryWatch:
    """The canaries' two watches: before the rest is replayed, and after it.

    Before: from the canaries' sending until they are due plus the wait in
    force; a canary parking again stops the replay. After the last message:
    until the wait in force has passed again *and* the derived wait since the
    canaries were due, so a short given wait lets the rest go early but never
    confirms early.
    """

    def __init__(self, canary: Canary) -> None:
        self.canary = canary
        self.wait: CanaryWait | None = None
        self.verdict: str | None = None
        self._due: float | None = None

    @property
    def started(self) -> bool:
        return self._due is not None

    def _tell(self, phase: CanaryPhase, *, until: float | None = None, rest: int = 0) -> None:
        if self.canary.news is None or self.wait is None:
            return
        when = None
        if until is not None:
            left = until - asyncio.get_running_loop().time()
            when = utcnow() + timedelta(seconds=max(left, 0.0))
        self.canary.news(
            CanaryNews(
                phase=phase, ids=tuple(self.canary.slots.ids), wait=self.wait, until=when, rest=rest
            )
        )

    async def before_the_rest(self) -> bool:
        """Watch the canaries sent (all settled) until due plus the wait; ``True``: parked again."""
        slots = self.canary.slots
        self.wait = CanaryWait.choose(slots.spans, given=self.canary.wait)
        if self.wait.short:
            log.warning("%s", self.wait.warning())
        self._due = asyncio.get_running_loop().time() + self.canary.delay
        until = self._due + self.wait.seconds
        self._tell("watching", until=until)
        if await self.canary.parked_again(slots.token, until):
            self.verdict = CANARY_PARKED_AGAIN
            self._tell("parked-again")
            return True
        self._tell("passed")
        return False

    async def after_the_rest(self, *, rest: int) -> None:
        """Keep watching after the last message (``rest`` replayed after the canaries)."""
        assert self.wait is not None and self._due is not None
        now = asyncio.get_running_loop().time()
        until = max(now + self.wait.seconds, self._due + self.wait.derived)
        if rest == 0:
            # Only canaries were replayed: the watch before covered the wait in force.
            until = self._due + max(self.wait.seconds, self.wait.derived)
        if until > now:
            self._tell("confirming", until=until, rest=rest)
            if await self.canary.parked_again(self.canary.slots.token, until):
                self.verdict = CANARY_PARKED_AFTER_THE_REST if rest else CANARY_PARKED_AGAIN
                self._tell("parked-again-after-the-rest" if rest else "parked-again", rest=rest)
                return
        self.verdict = CANARY_CONFIRMED
        self._tell("confirmed", rest=rest)
