"""Operate on a parking lot: filter, browse, group, replay and purge parked messages.

This is the library behind ``delayed-retry parking ...`` and the web view.
Use :class:`ParkedFilter` to say which parked messages you mean (it is pure:
``matches(record)`` decides), :func:`browse_parked` to show one page of them,
:func:`group_parked` to see the failure groups, and :func:`replay_matching` /
:func:`purge_matching` to act on them.

Every operation works on the parking queue *as it was when asked*: it looks
at no more messages than the queue held when it started, so messages parked
meanwhile are left alone. Reading never removes anything: messages are taken
unacked on a channel of the operation's own and the broker puts back every
one not acted on. Acting is at-least-once: a replayed message leaves the
parking queue only after the broker confirmed its copy, a purged one only
when the operation acks it; a failing operation moves or loses nothing (at
worst one message is replayed twice).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

import aiormq
import aiormq.abc

from delayed_retry.amqp.declare import declarer_for, underlay_of
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT, copy_properties, publish_confirmed
from delayed_retry.checks import broker_major_version, kept_queue_risk
from delayed_retry.durations import Duration, to_seconds, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers import (
    X_REPLAY_CANARY,
)
from delayed_retry.parking.records import (
    ALL_PARKED,
    ParkedFilter,
    ParkedMessage,
    ParkedRecord,
    parse_parked,
    read_record,
    replay_headers,
)
from delayed_retry.topology import DEFAULT_TOPOLOGY, DelayTopology, amqp_arguments

__all__ = [
    "ALL_PARKED",
    "FailureGroup",
    "MoveProgress",
    "MoveReport",
    "ParkedFilter",
    "ParkedMessage",
    "ParkedPage",
    "ParkedRecord",
    "browse_parked",
    "group_parked",
    "iter_parked",
    "parse_parked",
    "purge_matching",
    "read_record",
    "refuse_counted_peeks",
    "replay_headers",
    "replay_matching",
]

log = logging.getLogger(__name__)


# -- reading ------------------------------------------------------------------
def _parking_name(topology: DelayTopology, queue: str, parking_queue: str | None) -> str:
    return parking_queue or topology.default_parking_queue(queue)


@asynccontextmanager
async def _own_channel(
    channel: Any, *, confirms: bool
) -> AsyncIterator[aiormq.abc.AbstractChannel]:
    """A channel of the operation's own: closing it returns every message not acked."""
    underlay = await underlay_of(channel)
    own = await underlay.connection.channel(publisher_confirms=confirms)
    try:
        yield own
    finally:
        if not own.is_closed:
            await own.close()


async def refuse_counted_peeks(
    connection: Any, topology: DelayTopology, queue: str, parking_queue: str | None
) -> None:
    """Raise when reading would count toward a delivery limit that can drop parked messages.

    Every read of the parking lot (peek, browse, replay, purge) takes messages
    unacked and gives back those it does not act on; each return counts as a
    delivery. On RabbitMQ 4.x a parking queue declared without delayed-retry's
    delivery limit has the broker's limit of 20, which reads would exhaust.
    """
    major = broker_major_version(getattr(connection, "server_properties", None))
    spec = topology.parking_queue_spec(queue, parking_queue)
    if major is None or major < 4 or topology.queue_type != "quorum":
        return
    check = await connection.channel(publisher_confirms=False)
    try:
        await check.queue_declare(spec.name, durable=True, arguments=amqp_arguments(spec.arguments))
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        if "x-delivery-limit" not in str(exc):
            raise
        raise ConfigurationError(
            f"{kept_queue_risk(queue=spec.name, broker_major=major)}. peek_parked does not "
            "peek it meanwhile, since every peek would bring its messages closer to the limit"
        ) from exc
    finally:
        if not check.is_closed:
            await check.close()


async def _refuse_counted_reads(
    channel: Any, topology: DelayTopology, queue: str, parking_queue: str | None
) -> None:
    underlay = await underlay_of(channel)
    await refuse_counted_peeks(underlay.connection, topology, queue, parking_queue)


async def _depth(own: aiormq.abc.AbstractChannel, parking: str) -> int:
    try:
        declared = await own.queue_declare(parking, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise ConfigurationError(
            f"parking queue {parking!r} does not exist; check the queue name (--queue, "
            "--parking-queue) and the vhost in the URL"
        ) from exc
    return int(declared.message_count or 0)


async def _take(
    own: aiormq.abc.AbstractChannel, parking: str, *, asked_at: datetime
) -> AsyncIterator[tuple[aiormq.abc.DeliveredMessage, ParkedRecord]]:
    """The messages of ``parking`` that were there at ``asked_at``, taken unacked, in order.

    Every message taken stays unacked on ``own`` until it is acked or the
    channel closes, so none is taken twice and the scan ends when the queue
    has nothing more to give. Messages parked or replayed after ``asked_at``
    (their record says so) are put back untouched: the set is the one asked about.
    The declare-ok message count cannot bound the scan: on quorum queues it
    leaves out messages a closed channel just returned.
    """
    while True:
        got = await own.basic_get(parking, no_ack=False)
        if got.delivery_tag is None:
            return
        props = got.header.properties
        record = read_record(
            props.headers,
            message_id=props.message_id,
            body=got.body,
            exchange=got.exchange,
            routing_key=got.routing_key,
            content_type=props.content_type,
        )
        if record.parked_at is not None and record.parked_at > asked_at:
            continue
        # Replayed since (by this very operation, say, and parked again): the replay's own
        # clock wrote this time, so a consumer's clock skew cannot make it look old.
        if record.replayed_at is not None and record.replayed_at >= asked_at:
            continue
        yield got, record


async def iter_parked(
    channel: Any,
    *,
    queue: str,
    parking_queue: str | None = None,
    where: ParkedFilter = ALL_PARKED,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    now: datetime | None = None,
) -> AsyncIterator[ParkedRecord]:
    """Every parked message of ``queue`` that ``where`` selects, left in place.

    Use it to go through a whole parking lot one record at a time (memory
    holds one record); use :func:`browse_parked` for a page.
    """
    when = now or utcnow()
    parking = _parking_name(topology, queue, parking_queue)
    async with _own_channel(channel, confirms=False) as own:
        await _depth(own, parking)
        await _refuse_counted_reads(channel, topology, queue, parking_queue)
        async for _got, record in _take(own, parking, asked_at=when):
            if where.matches(record, now=when):
                yield record


@dataclass(frozen=True, kw_only=True)
class ParkedPage:
    """One page of parked records, and where the next one starts (``None``: no more)."""

    records: tuple[ParkedRecord, ...]
    offset: int
    next_offset: int | None
    depth: int
    """Messages the broker counted in the parking queue when the page was read (on quorum
    queues it may leave out messages another reader just returned)."""


async def browse_parked(
    channel: Any,
    *,
    queue: str,
    parking_queue: str | None = None,
    where: ParkedFilter = ALL_PARKED,
    offset: int = 0,
    limit: int = 50,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    now: datetime | None = None,
) -> ParkedPage:
    """The ``limit`` selected records after the first ``offset`` selected ones, left in place.

    Only the page is kept in memory; the records before it are read and
    dropped. Pass ``next_offset`` back for the next page.
    """
    if limit < 1 or offset < 0:
        raise ConfigurationError(f"limit={limit} must be at least 1 and offset={offset} at least 0")
    when = now or utcnow()
    parking = _parking_name(topology, queue, parking_queue)
    async with _own_channel(channel, confirms=False) as own:
        depth = await _depth(own, parking)
        await _refuse_counted_reads(channel, topology, queue, parking_queue)
        seen = 0
        page: list[ParkedRecord] = []
        more = False
        async for _got, record in _take(own, parking, asked_at=when):
            if not where.matches(record, now=when):
                continue
            seen += 1
            if seen <= offset:
                continue
            if len(page) == limit:
                more = True
                break
            page.append(record)
    return ParkedPage(
        records=tuple(page),
        offset=offset,
        next_offset=offset + len(page) if more else None,
        depth=depth,
    )


@dataclass(frozen=True, kw_only=True)
class FailureGroup:
    """Parked messages that failed the same way (one fingerprint)."""

    fingerprint: str
    failure: str
    """The group in words: exception type, raising frame, message template."""
    count: int
    reason: str
    exception_type: str | None
    example: ParkedMessage
    oldest_parked_at: datetime | None
    newest_parked_at: datetime | None


async def group_parked(
    channel: Any,
    *,
    queue: str,
    parking_queue: str | None = None,
    where: ParkedFilter = ALL_PARKED,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
) -> list[FailureGroup]:
    """The failure groups of the selected parked messages, largest first."""
    groups: dict[str, FailureGroup] = {}
    async for record in iter_parked(
        channel, queue=queue, parking_queue=parking_queue, where=where, topology=topology
    ):
        group = groups.get(record.fingerprint)
        if group is None:
            example = ParkedMessage(
                **{f: getattr(record, f) for f in ParkedMessage.__dataclass_fields__}
            )
            groups[record.fingerprint] = FailureGroup(
                fingerprint=record.fingerprint,
                failure=record.failure,
                count=1,
                reason=record.reason,
                exception_type=record.exception_type,
                example=example,
                oldest_parked_at=record.parked_at,
                newest_parked_at=record.parked_at,
            )
            continue
        times = [t for t in (group.oldest_parked_at, record.parked_at) if t is not None]
        newest = [t for t in (group.newest_parked_at, record.parked_at) if t is not None]
        groups[record.fingerprint] = replace(
            group,
            count=group.count + 1,
            oldest_parked_at=min(times) if times else None,
            newest_parked_at=max(newest) if newest else None,
        )
    return sorted(groups.values(), key=lambda g: (-g.count, g.fingerprint))


# -- acting -------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MoveProgress:
    """Where a replay or purge is, given to the ``progress`` callback after each message."""

    action: Literal["replay", "purge"]
    done: int
    """Messages replayed or purged so far (would be, in a dry run)."""
    scanned: int
    """Messages looked at so far."""
    depth: int
    """Messages the broker counted in the parking queue at the start: a progress total."""
    record: ParkedRecord | None
    """The record just acted on (``None`` for a skipped one)."""
    dry_run: bool


@dataclass(frozen=True, kw_only=True)
class MoveReport:
    """What a replay or purge did (or, in a dry run, would have done)."""

    action: Literal["replay", "purge"]
    done: int
    scanned: int
    depth: int
    dry_run: bool
    to_queue: str | None = None
    stopped: str | None = None
    """Why it stopped before the end, or ``None`` when it went through the whole set."""
    canary_ids: tuple[str, ...] = ()


MAX_IN_FLIGHT = 64
"""Replayed copies awaiting their broker confirm at once (each original is acked after its own)."""


class _Pacer:
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


async def _canary_parked_again(
    channel: Any, parking: str, token: str, *, deadline: float, poll: float
) -> bool:
    """Whether a copy carrying ``token`` parks again before ``deadline`` (loop time)."""
    loop = asyncio.get_running_loop()
    while True:
        async with _own_channel(channel, confirms=False) as own:
            await _depth(own, parking)
            async for _got, record in _take(own, parking, asked_at=utcnow()):
                if record.headers.get(X_REPLAY_CANARY) == token:
                    return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(min(poll, max(deadline - loop.time(), 0)))


WATCH_EXPIRES_MS = 15 * 60 * 1000
"""A canary watch queue left unused this long is deleted by the broker."""


class _ParkWatch:
    """A private queue bound to the parking exchange: sees every message parked for a queue.

    Canaries are recognised there as they park again, without scanning the
    parking queue (which may hold thousands of messages). It gets copies:
    taking them changes nothing in the parking queue.
    """

    def __init__(self, channel: aiormq.abc.AbstractChannel, name: str) -> None:
        self._channel = channel
        self._name = name

    @classmethod
    async def open(cls, channel: Any, *, exchange: str, queue: str) -> _ParkWatch | None:
        """Start watching; ``None`` when the parking exchange cannot be bound (not ours)."""
        underlay = await underlay_of(channel)
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
            if not own.is_closed:
                await own.close()
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
            if not self._channel.is_closed:
                await self._channel.close()


async def _move(
    channel: Any,
    *,
    action: Literal["replay", "purge"],
    queue: str,
    parking_queue: str | None,
    where: ParkedFilter,
    limit: int | None,
    rate: float | None,
    dry_run: bool,
    progress: Callable[[MoveProgress], None] | None,
    topology: DelayTopology,
    send: Callable[[aiormq.abc.AbstractChannel, aiormq.abc.DeliveredMessage, str | None], Any]
    | None,
    canary: int = 0,
    canary_check: Callable[[str], Any] | None = None,
    to_queue: str | None = None,
) -> MoveReport:
    if limit is not None and limit < 0:
        raise ConfigurationError(f"limit={limit} must be zero or more")
    pacer = _Pacer(rate)
    now = utcnow()
    parking = _parking_name(topology, queue, parking_queue)
    selected = scanned = done = 0
    canary_ids: list[str] = []
    token = uuid.uuid4().hex if canary and not dry_run else None
    stopped: str | None = None
    depth = 0
    # Hand-overs run concurrently, up to MAX_IN_FLIGHT, each acked only once its own copy
    # is confirmed; one message id at a time (a return is matched to its publish by id).
    window = asyncio.Semaphore(MAX_IN_FLIGHT)
    in_flight: dict[str, asyncio.Task[None]] = {}
    failures: list[BaseException] = []

    def report(record: ParkedRecord | None) -> None:
        if progress is not None:
            progress(
                MoveProgress(
                    action=action,
                    done=done,
                    scanned=scanned,
                    depth=depth,
                    record=record,
                    dry_run=dry_run,
                )
            )

    async def hand_over(
        own: aiormq.abc.AbstractChannel,
        got: aiormq.abc.DeliveredMessage,
        record: ParkedRecord,
        canary_token: str | None,
    ) -> None:
        nonlocal done
        try:
            if send is not None:
                await send(own, got, canary_token)
            await own.basic_ack(got.delivery_tag or 0)
            done += 1
            report(record)
        except BaseException as exc:  # left unacked: the broker puts it back
            failures.append(exc)
        finally:
            window.release()
            # Forget it once settled: memory holds the messages in flight, not all moved.
            if in_flight.get(record.id) is asyncio.current_task():
                del in_flight[record.id]

    async def settle() -> None:
        if in_flight:
            await asyncio.gather(*list(in_flight.values()))

    async with _own_channel(channel, confirms=action == "replay") as own:
        depth = await _depth(own, parking)
        await _refuse_counted_reads(channel, topology, queue, parking_queue)
        try:
            async for got, record in _take(own, parking, asked_at=now):
                if failures:
                    break
                if limit is not None and selected >= limit:
                    stopped = "limit"
                    break
                scanned += 1
                if not where.matches(record, now=now):
                    # Held unacked until the end, so it is not taken again; then put back.
                    report(None)
                    continue
                selected += 1
                await pacer.wait()
                if dry_run:
                    done += 1
                    report(record)
                    continue
                in_canary = token is not None and len(canary_ids) < canary
                earlier = in_flight.get(record.id)
                if earlier is not None:
                    await earlier
                await window.acquire()
                in_flight[record.id] = asyncio.create_task(
                    hand_over(own, got, record, token if in_canary else None)
                )
                if in_canary:
                    canary_ids.append(record.id)
                    if len(canary_ids) == canary and canary_check is not None:
                        await settle()
                        if not failures and await canary_check(token or ""):
                            stopped = "canary-parked-again"
                            break
            await settle()
            # Fewer selected messages than the canary size: check the ones sent.
            short = token is not None and 0 < len(canary_ids) < canary and stopped is None
            if short and not failures and canary_check is not None:
                stopped = "canary-parked-again" if await canary_check(token or "") else None
        except aiormq.exceptions.AMQPError as exc:
            # A failed hand-over closed the channel under the loop: report that failure.
            if failures:
                raise failures[0] from exc
            raise
        finally:
            left = list(in_flight.values())
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
    if failures:
        log.warning("%s stopped after %d message(s) of %r: %s", action, done, parking, failures[0])
        raise failures[0]
    log.info(
        "%s%s %d of %d scanned message(s) in %r%s",
        "dry run: would " if dry_run else "",
        action,
        done,
        scanned,
        parking,
        f" (stopped: {stopped})" if stopped else "",
    )
    return MoveReport(
        action=action,
        done=done,
        scanned=scanned,
        depth=depth,
        dry_run=dry_run,
        to_queue=to_queue,
        stopped=stopped,
        canary_ids=tuple(canary_ids),
    )


async def _check_queue(channel: Any, name: str) -> None:
    async with _own_channel(channel, confirms=False) as own:
        try:
            await own.queue_declare(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise ConfigurationError(
                f"queue {name!r} does not exist, so nothing can be replayed to it; check the "
                "name (--queue, --to) and the vhost in the URL"
            ) from exc


async def replay_matching(
    channel: Any,
    *,
    queue: str,
    parking_queue: str | None = None,
    to_queue: str | None = None,
    where: ParkedFilter = ALL_PARKED,
    limit: int | None = None,
    rate: float | None = None,
    delay: Duration = 0,
    canary: int = 0,
    canary_wait: Duration = 60,
    canary_poll: Duration = 1,
    dry_run: bool = False,
    progress: Callable[[MoveProgress], None] | None = None,
    replayed_by: str | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
) -> MoveReport:
    """Send the selected parked messages of ``queue`` back to ``to_queue`` (default ``queue``).

    Use it once the cause of a failure group is fixed. Each message goes
    through the delay chain (due after ``delay``) with a fresh retry budget
    (see :func:`replay_headers`), and is acked in the parking queue only
    after the broker confirmed the copy. ``rate`` caps messages per second.
    ``canary=N`` replays the first N, waits until they are due and then up
    to ``canary_wait`` seconds, and stops (``MoveReport.stopped`` is
    ``"canary-parked-again"``) if any of them parks again: the rest stay
    parked. ``dry_run`` moves nothing and reports what would move. Messages
    are looked at in queue order, at most as many as the queue held at the
    start; ``limit`` caps how many are replayed.
    """
    seconds = to_seconds(delay)
    wait_seconds = to_seconds(canary_wait, name="canary_wait")
    poll_seconds = max(to_seconds(canary_poll, name="canary_poll"), 0.05)
    if canary < 0:
        raise ConfigurationError(f"canary={canary} must be zero or more messages")
    target = to_queue or queue
    topology.check_destination(target)
    # Checked before anything is taken: an over-long delay refuses the whole replay.
    if timedelta(seconds=seconds) > topology.max_delay:
        topology.units_until(utcnow() + timedelta(seconds=seconds), now=utcnow())
    await _check_queue(channel, target)
    parking = _parking_name(topology, queue, parking_queue)
    if not dry_run:
        underlay = await underlay_of(channel)
        await declarer_for(underlay.connection).destination(
            underlay.connection, topology, target, with_parking=False
        )

    async def send(
        own: aiormq.abc.AbstractChannel, got: aiormq.abc.DeliveredMessage, token: str | None
    ) -> None:
        now = utcnow()
        due_at = now + timedelta(seconds=seconds)
        route = topology.route(topology.units_until(due_at, now=now), target)
        headers = replay_headers(
            got.header.properties.headers, due_at=due_at, now=now, replayed_by=replayed_by
        )
        if token is not None:
            headers[X_REPLAY_CANARY] = token
        await publish_confirmed(
            own,
            exchange=route.exchange,
            routing_key=route.routing_key,
            body=got.body,
            properties=copy_properties(got.header.properties, headers),
            timeout=publish_timeout,
        )

    watch = None
    if canary and not dry_run:
        watch = await _ParkWatch.open(channel, exchange=topology.parking_exchange, queue=target)

    async def canary_check(token: str) -> bool:
        deadline = asyncio.get_running_loop().time() + seconds + wait_seconds
        if watch is not None:
            return await watch.parked_again(token, deadline=deadline, poll=poll_seconds)
        return await _canary_parked_again(
            channel, parking, token, deadline=deadline, poll=poll_seconds
        )

    try:
        return await _move(
            channel,
            action="replay",
            queue=queue,
            parking_queue=parking_queue,
            where=where,
            limit=limit,
            rate=rate,
            dry_run=dry_run,
            progress=progress,
            topology=topology,
            send=send,
            canary=canary,
            canary_check=canary_check,
            to_queue=target,
        )
    finally:
        if watch is not None:
            await watch.close()


async def purge_matching(
    channel: Any,
    *,
    queue: str,
    parking_queue: str | None = None,
    where: ParkedFilter = ALL_PARKED,
    limit: int | None = None,
    rate: float | None = None,
    dry_run: bool = False,
    progress: Callable[[MoveProgress], None] | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
) -> MoveReport:
    """Delete the selected parked messages of ``queue`` for good.

    Use it for messages that will never succeed (archive them first if
    anyone may ask). Only the selected messages are acked; everything else
    is put back. The caller is responsible for having asked the operator.
    """
    return await _move(
        channel,
        action="purge",
        queue=queue,
        parking_queue=parking_queue,
        where=where,
        limit=limit,
        rate=rate,
        dry_run=dry_run,
        progress=progress,
        topology=topology,
        send=None,
    )
