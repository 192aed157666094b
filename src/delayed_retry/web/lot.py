"""The broker side of the web view, on :mod:`delayed_retry.parking.lot`.

Reading and acting are the parking lot library's (the command line's too):
reads take messages unacked on a channel of their own and the broker puts
every one back; replay and purge are at-least-once. This module adds what a
page needs in one pass over a parking queue (the page, the failure groups,
arrival times, the matching count) and queue counts for the live overview.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import datetime

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection

from delayed_retry.amqp.channels import close_quietly, underlay_channel
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.parking.fingerprint import Fingerprint
from delayed_retry.parking.lot import (
    CanaryNews,
    MoveProgress,
    MoveReport,
    ParkedFilter,
    ParkedRecord,
    iter_parked,
    purge_matching,
    replay_matching,
)
from delayed_retry.web.records import CommonValues, group_fingerprint

__all__ = ["GroupSummary", "Page", "ParkingLot", "Selection"]

log = logging.getLogger(__name__)


@dataclass
class GroupSummary:
    """One failure group among the matching messages.

    ``label`` is the group's template (what groups it); :meth:`shown` fills
    in the most common value of each masked part for people to read.
    """

    group: str
    label: str
    exception_type: str | None
    fingerprint: Fingerprint | None = None
    count: int = 0
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    values: CommonValues = field(default_factory=CommonValues)

    def shown(self) -> tuple[str, str]:
        """The label with the most common masked values filled in, and a note saying so."""
        if self.fingerprint is None:
            return self.label, ""
        return self.values.label(self.fingerprint, group_size=self.count)

    def add(self, record: ParkedRecord) -> None:
        self.values.add(record.exception_message)
        self.count += 1
        seen = record.parked_at
        if seen is not None:
            if self.first_seen is None or seen < self.first_seen:
                self.first_seen = seen
            if self.last_seen is None or seen > self.last_seen:
                self.last_seen = seen


@dataclass
class Page:
    """A page of matching messages, newest parked first, with the groups and count of every
    matching one.

    ``items`` are the records without body and headers (a page holds no more than it
    shows; their body sizes are in ``body_sizes``, in the same order): read one in full with
    :meth:`ParkingLot.find`.
    """

    items: list[ParkedRecord]
    offset: int
    limit: int
    matching: int
    truncated: bool
    groups: list[GroupSummary]
    arrivals: list[datetime] = field(default_factory=list)
    body_sizes: list[int] = field(default_factory=list)
    """The body size of each item, in order."""


@dataclass(frozen=True)
class Selection:
    """The messages an action will work on, as they were when selected."""

    ids: list[str]
    first: list[ParkedRecord]
    """The first few selected records, in queue order: a replay's canaries."""


def _listed(record: ParkedRecord) -> ParkedRecord:
    """``record`` as a list row needs it: without body and headers."""
    return replace(record, body=b"", headers={})


class ParkingLot:
    """Read and act on parking queues through one aio-pika connection.

    Use one per web application; every read or action opens channels of its
    own, so they may run concurrently.
    """

    def __init__(
        self,
        connection: AbstractConnection,
        *,
        topology: DelayTopology,
        scan_limit: int = 10_000,
        publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
    ) -> None:
        self._connection = connection
        self.topology = topology
        self.scan_limit = scan_limit
        self.publish_timeout = publish_timeout
        self._anchor: AbstractChannel | None = None
        self._count_channel: aiormq.abc.AbstractChannel | None = None
        self._lock = asyncio.Lock()

    async def channel(self) -> AbstractChannel:
        """A channel of the connection, kept open; the library opens its own from it."""
        async with self._lock:
            if self._anchor is None or self._anchor.is_closed:
                self._anchor = await self._connection.channel(publisher_confirms=False)
            return self._anchor

    # -- counts ----------------------------------------------------------------
    async def counts(self, names: Collection[str]) -> dict[str, int | None]:
        """Messages ready in each queue (``None``: the queue does not exist)."""
        out: dict[str, int | None] = {}
        anchor = await self.channel()
        async with self._lock:
            for name in names:
                if self._count_channel is None or self._count_channel.is_closed:
                    underlay = await underlay_channel(anchor)
                    self._count_channel = await underlay.connection.channel(
                        publisher_confirms=False
                    )
                try:
                    ok = await self._count_channel.queue_declare(name, passive=True)
                    out[name] = int(ok.message_count or 0)
                except aiormq.exceptions.ChannelNotFoundEntity:
                    out[name] = None
                    self._count_channel = None
        return out

    async def close(self) -> None:
        """Close the channels kept open."""
        for channel in (self._count_channel, self._anchor):
            await close_quietly(channel)

    # -- reading ---------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _records(
        self, parking_queue: str, where: ParkedFilter
    ) -> AsyncIterator[AsyncIterator[ParkedRecord]]:
        records = iter_parked(
            await self.channel(),
            queue=parking_queue,
            parking_queue=parking_queue,
            where=where,
            topology=self.topology,
        )
        try:
            yield records
        finally:
            # Close the generator now (and with it its channel, returning every message)
            # when the caller stops early, not whenever it is collected.
            close = getattr(records, "aclose", None)
            if close is not None:
                await close()

    async def page(
        self, parking_queue: str, *, where: ParkedFilter, offset: int = 0, limit: int = 25
    ) -> Page:
        """One page of the messages ``where`` selects, newest parked first, with groups and
        count; nothing removed.

        Sorted by parking time (a record without one last), then by place in the queue
        (later first). Only the ``offset + limit`` newest are held while reading, without
        their bodies.
        """
        keep = offset + limit
        # A min-heap of the newest `keep`: (parked at, place in the queue, body size, row).
        newest: list[tuple[float, int, int, ParkedRecord]] = []
        groups: dict[str, GroupSummary] = {}
        arrivals: list[datetime] = []
        matching = 0
        truncated = False
        async with self._records(parking_queue, where) as records:
            async for record in records:
                if matching >= self.scan_limit:
                    truncated = True
                    break
                if record.parked_at is not None:
                    arrivals.append(record.parked_at)
                summary = groups.get(record.fingerprint)
                if summary is None:
                    named = group_fingerprint(record)
                    summary = groups[record.fingerprint] = GroupSummary(
                        group=record.fingerprint,
                        label=named.label(),
                        exception_type=record.exception_type,
                        fingerprint=named,
                    )
                summary.add(record)
                when = record.parked_at.timestamp() if record.parked_at else -math.inf
                if len(newest) < keep:
                    heapq.heappush(newest, (when, matching, len(record.body), _listed(record)))
                elif keep and (when, matching) > newest[0][:2]:
                    heapq.heapreplace(newest, (when, matching, len(record.body), _listed(record)))
                matching += 1
        rows = sorted(newest, key=lambda e: (e[0], e[1]), reverse=True)[offset : offset + limit]
        return Page(
            items=[row for _, _, _, row in rows],
            offset=offset,
            limit=limit,
            matching=matching,
            truncated=truncated,
            groups=sorted(groups.values(), key=lambda g: (-g.count, g.label)),
            arrivals=arrivals,
            body_sizes=[size for _, _, size, _ in rows],
        )

    async def find(self, parking_queue: str, key: str) -> ParkedRecord | None:
        """The message with id ``key`` (left in place), or ``None``."""
        async with self._records(parking_queue, ParkedFilter(ids=frozenset({key}))) as records:
            async for record in records:
                return record
        return None

    async def select(self, parking_queue: str, *, where: ParkedFilter, keep: int = 0) -> Selection:
        """The ids of every message ``where`` selects now (the set an action works on), and
        the records of the first ``keep`` of them (a replay's would-be canaries)."""
        ids: dict[str, None] = {}  # ordered, each id once
        first: list[ParkedRecord] = []
        async with self._records(parking_queue, where) as records:
            async for record in records:
                if record.id in ids:
                    continue
                ids[record.id] = None
                if len(first) < keep:
                    first.append(record)
        return Selection(ids=list(ids), first=first)

    # -- acting ----------------------------------------------------------------
    async def replay(
        self,
        parking_queue: str,
        *,
        ids: Collection[str],
        to_queue: str,
        rate: float | None,
        canary: int,
        canary_wait: float | None,
        canary_news: Callable[[CanaryNews], None] | None,
        replayed_by: str,
        progress: Callable[[MoveProgress], None],
    ) -> MoveReport:
        """Replay the messages with these ids to ``to_queue`` (see ``replay_matching``)."""
        return await replay_matching(
            await self.channel(),
            queue=parking_queue,
            parking_queue=parking_queue,
            to_queue=to_queue,
            where=ParkedFilter(ids=frozenset(ids)),
            rate=rate,
            canary=canary,
            canary_wait=canary_wait,
            canary_news=canary_news,
            progress=progress,
            replayed_by=replayed_by,
            topology=self.topology,
            publish_timeout=self.publish_timeout,
        )

    async def purge(
        self,
        parking_queue: str,
        *,
        ids: Collection[str],
        rate: float | None,
        progress: Callable[[MoveProgress], None],
    ) -> MoveReport:
        """Purge the messages with these ids (see ``purge_matching``)."""
        return await purge_matching(
            await self.channel(),
            queue=parking_queue,
            parking_queue=parking_queue,
            where=ParkedFilter(ids=frozenset(ids)),
            rate=rate,
            progress=progress,
            topology=self.topology,
        )
