"""Replaying, purging or refreshing parked messages: one scan, one action per selected message.

:func:`move` takes the messages present in a parking queue when asked
(:func:`~delayed_retry.parking.scan.take`), keeps those a
:class:`MoveRequest` selects, and hands each to a
:class:`~delayed_retry.parking.moving.actions.MessageAction`. :class:`HandOvers` runs those
concurrently, :class:`Pacer` keeps the rate, and a
:class:`~delayed_retry.parking.moving.canary.Canary` stops a replay whose first copies park
again (and, once the rest is replayed, keeps watching them until their wait has passed). The
counts go to a :class:`~delayed_retry.parking.moving.report.MoveTally`.

Acting is at-least-once: a message leaves the parking queue only when its
action acks it; everything not acked goes back when the channel closes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.durations import utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.parking.moving.actions import MessageAction
from delayed_retry.parking.moving.canary import Canary, CanaryWatch
from delayed_retry.parking.moving.report import (
    CANARY_PARKED_AGAIN,
    LIMIT_REACHED,
    MoveProgress,
    MoveReport,
    MoveTally,
)
from delayed_retry.parking.records import ALL_PARKED, ParkedFilter, ParkedRecord
from delayed_retry.parking.scan import (
    own_channel,
    parking_name,
    queue_depth,
    refuse_counted_reads,
    take,
)

__all__ = ["MAX_IN_FLIGHT", "HandOvers", "MoveRequest", "Pacer", "move"]

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
"""Replayed copies awaiting their broker confirm at once (each original is acked after its own)."""


@dataclass(frozen=True, kw_only=True)
class MoveRequest:
    """Which parked messages a move takes, and how: the lot, the selection, the pace."""

    queue: str
    parking_queue: str | None = None
    topology: DelayTopology
    where: ParkedFilter = ALL_PARKED
    limit: int | None = None
    """At most this many selected messages (``None``: all of them)."""
    rate: float | None = None
    """At most this many messages per second (``None``: as fast as possible)."""
    dry_run: bool = False
    progress: Callable[[MoveProgress], None] | None = None

    @property
    def parking(self) -> str:
        """The parking queue's name."""
        return parking_name(self.topology, self.queue, self.parking_queue)


class Pacer:
    """Spaces actions to at most ``rate`` per second (``None``: as fast as possible)."""

    def __init__(self, rate: float | None) -> None:
        if rate is not None and not rate > 0:
            raise ConfigurationError(
                f"rate={rate!r} must be a positive number of messages per second"
            )
        self._rate = rate
        self._start: float | None = None
        self._count = 0

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        if self._rate is not None:
            delay = self._start + self._count / self._rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        self._count += 1


class HandOvers:
    """Runs actions concurrently, at most ``limit`` at once and one per key at a time.

    Use it as ``async with``: leaving cancels whatever still runs. A failing
    action does not stop the others; its exception is kept (:attr:`failure`
    is the first) for the caller to stop taking new work and raise it. The
    key is the message id: the broker's return of a copy is matched to its
    publish by id, so two copies with one id never wait for a confirm together.
    """

    def __init__(self, limit: int) -> None:
        self._window = asyncio.Semaphore(limit)
        self._running: dict[str, asyncio.Task[None]] = {}
        self.failures: list[BaseException] = []

    @property
    def failure(self) -> BaseException | None:
        """The first exception an action raised, or ``None``."""
        return self.failures[0] if self.failures else None

    async def start(self, key: str, work: Callable[[], Awaitable[None]]) -> None:
        """Start ``work`` once the one running for ``key`` is done and the window has room."""
        earlier = self._running.get(key)
        if earlier is not None:
            await earlier
        await self._window.acquire()
        self._running[key] = asyncio.create_task(self._run(key, work))

    async def _run(self, key: str, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except BaseException as exc:  # the action's message is left unacked: it goes back
            self.failures.append(exc)
        finally:
            self._window.release()
            # Forget it once settled: memory holds the actions running, not all done.
            if self._running.get(key) is asyncio.current_task():
                del self._running[key]

    async def settle(self) -> None:
        """Wait until every action started so far has finished (failed or not)."""
        if self._running:
            await asyncio.gather(*list(self._running.values()))

    async def cancel(self) -> None:
        """Cancel the actions still running and wait until they are gone."""
        left = list(self._running.values())
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def __aenter__(self) -> HandOvers:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.cancel()


async def _act(
    action: MessageAction,
    own: aiormq.abc.AbstractChannel,
    got: aiormq.abc.DeliveredMessage,
    record: ParkedRecord,
    canary_token: str | None,
    tally: MoveTally,
) -> None:
    await action.settle(own, got, canary_token=canary_token)
    tally.acted_on(record)


async def move(
    channel: Any,
    action: MessageAction,
    request: MoveRequest,
    *,
    canary: Canary | None = None,
) -> MoveReport:
    """Apply ``action`` to the messages ``request`` selects in the parking queue as it is now.

    ``channel`` (aio-pika or aiormq) only leads to its connection: the work
    happens on a channel of the move's own. With ``canary``, the move stops
    (``stopped="canary-parked-again"``) when a canary copy parks again before
    the rest is replayed; the rest stay parked. After the last message it
    keeps watching the canaries (see :class:`Canary`) and reports the verdict
    in ``canary_verdict``. The first failing action stops the move and is raised.
    """
    if request.limit is not None and request.limit < 0:
        raise ConfigurationError(f"limit={request.limit} must be zero or more")
    pacer = Pacer(request.rate)
    watch = CanaryWatch(canary) if canary is not None else None
    asked_at = utcnow()
    parking = request.parking
    tally = MoveTally(
        action=action.name,
        dry_run=request.dry_run,
        progress=request.progress,
        to_queue=action.to_queue,
    )
    async with (
        own_channel(channel, confirms=action.confirms) as own,
        HandOvers(MAX_IN_FLIGHT) as hand_overs,
    ):
        tally.depth = await queue_depth(own, parking)
        await refuse_counted_reads(channel, request.topology, request.queue, request.parking_queue)
        try:
            async for got, record in take(own, parking, asked_at=asked_at):
                if hand_overs.failure is not None:
                    break
                if tally.reached(request.limit):
                    tally.stopped = LIMIT_REACHED
                    break
                selected = request.where.matches(record, now=asked_at)
                tally.looked_at(selected=selected)
                if not selected:
                    continue  # held unacked until the end, so it is not taken again; then put back
                await pacer.wait()
                if request.dry_run:
                    tally.acted_on(record)
                    continue
                token = canary.slots.take(record) if canary is not None else None
                work = functools.partial(_act, action, own, got, record, token, tally)
                await hand_overs.start(record.id, work)
                if token is not None and watch is not None and watch.canary.slots.all_out:
                    await hand_overs.settle()
                    if hand_overs.failure is None and await watch.before_the_rest():
                        tally.stopped = CANARY_PARKED_AGAIN
                        break
            await hand_overs.settle()
            if (
                watch is not None
                and watch.canary.slots.ids
                and tally.stopped != CANARY_PARKED_AGAIN
                and hand_overs.failure is None
            ):
                # Fewer selected messages than the canary size: watch the ones sent now.
                if not watch.started and await watch.before_the_rest():
                    tally.stopped = CANARY_PARKED_AGAIN
                else:
                    await watch.after_the_rest(rest=tally.done - len(watch.canary.slots.ids))
        except aiormq.exceptions.AMQPError as exc:
            # A failed hand-over closed the channel under the loop: report that failure.
            if hand_overs.failure is not None:
                raise hand_overs.failure from exc
            raise
    if hand_overs.failure is not None:
        log.warning(
            "%s stopped after %d message(s) of %r: %s",
            action.name,
            tally.done,
            parking,
            hand_overs.failure,
        )
        raise hand_overs.failure
    log.info(
        "%s%s %d of %d scanned message(s) in %r%s",
        "dry run: would " if request.dry_run else "",
        action.name,
        tally.done,
        tally.scanned,
        parking,
        f" (stopped: {tally.stopped})" if tally.stopped else "",
    )
    if watch is None:
        return tally.report()
    return tally.report(
        canary_ids=tuple(watch.canary.slots.ids),
        canary_wait=watch.wait,
        canary_verdict=watch.verdict,
    )
