"""The broker side of the web view: counts, browsing pages, acting on a selection.

Browsing takes messages unacked on a channel of its own and closes it, so the
broker puts every one back; only the page being shown and one counter per
failure group are kept in memory, however long the queue. Acting (replay,
purge) takes messages the same way and settles only the selected ones: a
replayed message is acked in the parking queue only after the broker
confirmed its copy (at-least-once); everything else goes back when the
channel closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import aiormq
from aio_pika.abc import AbstractConnection

from delayed_retry.declare import declarer_for, underlay_of
from delayed_retry.durations import utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.parking import replay_headers
from delayed_retry.publishing import DEFAULT_PUBLISH_TIMEOUT, copy_properties, publish_confirmed
from delayed_retry.topology import DelayTopology
from delayed_retry.web.records import ParkedFilter, ParkedRecord, read_record

__all__ = ["ActionOutcome", "GroupSummary", "Page", "ParkingLot"]

log = logging.getLogger(__name__)


@dataclass
class GroupSummary:
    """One failure group among the matching messages."""

    group: str
    label: str
    exception_type: str | None
    count: int = 0
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    example_key: str = ""

    def add(self, record: ParkedRecord) -> None:
        self.count += 1
        seen = record.parked.parked_at
        if seen is not None:
            if self.first_seen is None or seen < self.first_seen:
                self.first_seen = seen
            if self.last_seen is None or seen > self.last_seen:
                self.last_seen = seen


@dataclass
class Page:
    """A page of matching messages, with totals over everything scanned."""

    items: list[ParkedRecord]
    offset: int
    limit: int
    matching: int
    scanned: int
    truncated: bool
    groups: list[GroupSummary]
    arrivals: list[datetime] = field(default_factory=list)


@dataclass
class ActionOutcome:
    """What one pass of an action did."""

    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class ParkingLot:
    """Read and act on parking queues through one aio-pika connection.

    Use one per web application; each call opens the short-lived channels it
    needs, so calls may run concurrently.
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
        self._count_channel: aiormq.abc.AbstractChannel | None = None
        self._count_lock = asyncio.Lock()

    async def _underlay_connection(self) -> aiormq.abc.AbstractConnection:
        transport = getattr(self._connection, "transport", None)
        underlying = getattr(transport, "connection", None)
        if isinstance(underlying, aiormq.abc.AbstractConnection) and not underlying.is_closed:
            return underlying
        # Reconnecting, or another connection type: a channel waits for and names it.
        channel = await self._connection.channel(publisher_confirms=False)
        try:
            underlay = await underlay_of(channel)
            return underlay.connection
        finally:
            await channel.close()

    @asynccontextmanager
    async def _channel(
        self, *, confirms: bool = False
    ) -> AsyncIterator[aiormq.abc.AbstractChannel]:
        connection = await self._underlay_connection()
        channel = await connection.channel(publisher_confirms=confirms)
        try:
            yield channel
        finally:
            if not channel.is_closed:
                await channel.close()

    # -- counts ----------------------------------------------------------------
    async def counts(self, names: Collection[str]) -> dict[str, int | None]:
        """Messages ready in each queue (``None``: the queue does not exist)."""
        out: dict[str, int | None] = {}
        async with self._count_lock:
            for name in names:
                if self._count_channel is None or self._count_channel.is_closed:
                    connection = await self._underlay_connection()
                    self._count_channel = await connection.channel(publisher_confirms=False)
                try:
                    ok = await self._count_channel.queue_declare(name, passive=True)
                    out[name] = int(ok.message_count or 0)
                except aiormq.exceptions.ChannelNotFoundEntity:
                    out[name] = None
                    self._count_channel = None
        return out

    async def close(self) -> None:
        """Close the channel kept for counting."""
        if self._count_channel is not None and not self._count_channel.is_closed:
            await self._count_channel.close()

    # -- reading ---------------------------------------------------------------
    async def _each(
        self, channel: aiormq.abc.AbstractChannel, parking_queue: str, *, limit: int
    ) -> AsyncIterator[tuple[aiormq.abc.DeliveredMessage, ParkedRecord]]:
        try:
            await channel.queue_declare(parking_queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise ConfigurationError(
                f"parking queue {parking_queue!r} does not exist; check the queue name "
                "(--queue) and that its consumers have parked something or declared it"
            ) from exc
        seen = 0
        while seen < limit:
            got = await channel.basic_get(parking_queue)
            if got.delivery_tag is None:
                return
            seen += 1
            props = got.header.properties
            yield (
                got,
                read_record(
                    props.headers,
                    message_id=props.message_id,
                    body=got.body,
                    exchange=got.exchange,
                    routing_key=got.routing_key,
                    content_type=props.content_type,
                ),
            )

    async def page(
        self,
        parking_queue: str,
        *,
        where: ParkedFilter,
        offset: int = 0,
        limit: int = 25,
    ) -> Page:
        """One page of the messages matching ``where``, with group counts; nothing is removed."""
        now = utcnow()
        items: list[ParkedRecord] = []
        groups: dict[str, GroupSummary] = {}
        arrivals: list[datetime] = []
        matching = scanned = 0
        async with self._channel() as channel:
            async for _, record in self._each(channel, parking_queue, limit=self.scan_limit):
                scanned += 1
                if record.parked.parked_at is not None and len(arrivals) < self.scan_limit:
                    arrivals.append(record.parked.parked_at)
                if not where.matches(record, now=now):
                    continue
                summary = groups.get(record.group)
                if summary is None:
                    summary = groups[record.group] = GroupSummary(
                        group=record.group,
                        label=record.group_label,
                        exception_type=record.parked.exception_type,
                        example_key=record.key,
                    )
                summary.add(record)
                if offset <= matching < offset + limit:
                    items.append(record)
                matching += 1
        ordered = sorted(groups.values(), key=lambda g: (-g.count, g.label))
        return Page(
            items=items,
            offset=offset,
            limit=limit,
            matching=matching,
            scanned=scanned,
            truncated=scanned >= self.scan_limit,
            groups=ordered,
            arrivals=arrivals,
        )

    async def find(self, parking_queue: str, key: str) -> ParkedRecord | None:
        """The message with ``key`` (left in place), or ``None``."""
        async with self._channel() as channel:
            async for _, record in self._each(channel, parking_queue, limit=self.scan_limit):
                if record.key == key:
                    return record
        return None

    async def select(self, parking_queue: str, *, where: ParkedFilter) -> list[str]:
        """The keys of every message matching ``where`` now: the set an action works on."""
        now = utcnow()
        keys: list[str] = []
        async with self._channel() as channel:
            async for _, record in self._each(channel, parking_queue, limit=self.scan_limit):
                if where.matches(record, now=now):
                    keys.append(record.key)
        return keys

    # -- acting ----------------------------------------------------------------
    async def act(
        self,
        parking_queue: str,
        *,
        action: str,
        keys: Collection[str],
        to_queue: str | None,
        rate: float | None,
        stop_after: int | None = None,
        progress: Callable[[str, str | None], Awaitable[None]] | None = None,
    ) -> ActionOutcome:
        """Replay or purge the messages whose key is in ``keys`` (each at most once).

        Replay publishes a copy through the chain to ``to_queue`` with a fresh
        retry budget and acks the parked message only after the confirm; a
        failed publish leaves it parked. Purge acks it. ``rate`` caps messages
        per second; ``stop_after`` ends the pass after that many (the canary).
        Messages not selected are never settled: closing the channel returns them.
        """
        if action not in ("replay", "purge"):
            raise ConfigurationError(f"action {action!r} must be 'replay' or 'purge'")
        wanted = set(keys)
        outcome = ActionOutcome()
        if not wanted:
            return outcome
        if action == "replay":
            if not to_queue:
                raise ConfigurationError("replay needs the queue to send messages to")
            self.topology.check_destination(to_queue)
            connection = await self._underlay_connection()
            await declarer_for(connection).destination(
                connection, self.topology, to_queue, with_parking=False
            )
        interval = 1.0 / rate if rate else 0.0
        next_at = time.monotonic()
        async with self._channel(confirms=True) as channel:
            async for got, record in self._each(channel, parking_queue, limit=self.scan_limit):
                if record.key not in wanted:
                    continue
                wanted.discard(record.key)
                if interval:
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    next_at = max(next_at, time.monotonic()) + interval
                tag = got.delivery_tag
                assert tag is not None
                if action == "replay":
                    assert to_queue is not None
                    try:
                        await self._replay_one(channel, got, to_queue)
                    except Exception as exc:
                        log.warning(
                            "replay of %r from %r failed: %s", record.key, parking_queue, exc
                        )
                        outcome.failed[record.key] = str(exc)
                        if progress:
                            await progress(record.key, str(exc))
                        if channel.is_closed:
                            break
                        continue
                await channel.basic_ack(tag)
                outcome.done.append(record.key)
                if progress:
                    await progress(record.key, None)
                if not wanted or (stop_after is not None and len(outcome.done) >= stop_after):
                    break
        return outcome

    async def _replay_one(
        self, channel: aiormq.abc.AbstractChannel, got: aiormq.abc.DeliveredMessage, to_queue: str
    ) -> None:
        now = utcnow()
        due_at = now + timedelta(0)
        route = self.topology.route(self.topology.units_until(due_at, now=now), to_queue)
        headers = replay_headers(got.header.properties.headers, due_at=due_at)
        await publish_confirmed(
            channel,
            exchange=route.exchange,
            routing_key=route.routing_key,
            body=got.body,
            properties=copy_properties(got.header.properties, headers),
            timeout=self.publish_timeout,
        )
