"""Operate on a parking lot: filter, browse, group, replay and purge parked messages.

The library behind ``delayed-retry parking ...`` and the web view. Use :class:`ParkedFilter`
to say which parked messages you mean, :func:`browse_parked` for one page of them,
:func:`group_parked` for the failure groups, and :func:`replay_matching` /
:func:`purge_matching` to act on them. Reading is :mod:`~delayed_retry.parking.scan`, moving
is :mod:`~delayed_retry.parking.moving`; what every operation promises (the queue as it
was when asked, at-least-once): docs/parking.md, "The library".
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import aiormq

from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import Duration, to_seconds, utcnow
from delayed_retry.errors import ConfigurationError, NotFoundError, queue_not_found
from delayed_retry.parking.moving.actions import PurgeAction, ReplayAction
from delayed_retry.parking.moving.canary import Canary, CanaryLookout
from delayed_retry.parking.moving.canary_rules import CanaryNews, CanarySlots, CanaryWait
from delayed_retry.parking.moving.engine import MoveRequest, move
from delayed_retry.parking.moving.report import MoveProgress, MoveReport
from delayed_retry.parking.records import (
    ALL_PARKED,
    ParkedFilter,
    ParkedMessage,
    ParkedRecord,
    parse_parked,
    read_record,
    replay_headers,
)
from delayed_retry.parking.scan import (
    own_channel,
    parking_name,
    queue_depth,
    refuse_counted_peeks,
    refuse_counted_reads,
    take,
)

__all__ = [
    "ALL_PARKED",
    "CanaryNews",
    "CanaryWait",
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
    "prepare_replay_target",
    "purge_matching",
    "read_record",
    "refuse_counted_peeks",
    "replay_headers",
    "replay_matching",
]

log = logging.getLogger(__name__)


# -- reading ------------------------------------------------------------------
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
    parking = parking_name(topology, queue, parking_queue)
    async with own_channel(channel, confirms=False) as own:
        await queue_depth(own, parking)
        await refuse_counted_reads(channel, topology, queue, parking_queue)
        async for _got, record in take(own, parking, asked_at=when):
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
    parking = parking_name(topology, queue, parking_queue)
    async with own_channel(channel, confirms=False) as own:
        depth = await queue_depth(own, parking)
        await refuse_counted_reads(channel, topology, queue, parking_queue)
        seen = 0
        page: list[ParkedRecord] = []
        more = False
        async for _got, record in take(own, parking, asked_at=when):
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
async def _check_queue(channel: Any, name: str) -> None:
    async with own_channel(channel, confirms=False) as own:
        try:
            await own.queue_declare(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise NotFoundError(queue_not_found(name, so="nothing can be replayed to it")) from exc


async def prepare_replay_target(
    channel: Any, topology: DelayTopology, target: str, *, delay: float, dry_run: bool
) -> None:
    """Check that ``target`` can take replayed copies due after ``delay`` seconds, and (unless
    ``dry_run``) declare its chain binding: before anything is taken from a parking queue."""
    topology.check_destination(target)
    # Checked before anything is taken: an over-long delay refuses the whole replay.
    if timedelta(seconds=delay) > topology.max_delay:
        topology.units_until(utcnow() + timedelta(seconds=delay), now=utcnow())
    await _check_queue(channel, target)
    if not dry_run:
        underlay = await underlay_channel(channel)
        await declarer_for(underlay.connection).destination(
            underlay.connection, topology, target, with_parking=False
        )


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
    canary_wait: Duration | None = None,
    canary_poll: Duration = 1,
    canary_news: Callable[[CanaryNews], None] | None = None,
    dry_run: bool = False,
    progress: Callable[[MoveProgress], None] | None = None,
    replayed_by: str | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
) -> MoveReport:
    """Send the selected parked messages of ``queue`` back to ``to_queue`` (default ``queue``).

    Use it once the cause of a failure group is fixed. Each copy goes through the chain (due
    after ``delay``) with a fresh retry budget and is acked in the parking queue only after its
    confirm; ``rate`` caps messages per second, ``limit`` the count, ``dry_run`` moves nothing.
    Use ``canary=N`` whenever the fix is not certain: the first N are watched for
    ``canary_wait`` (derived from their records when left out, see
    :mod:`~delayed_retry.parking.moving.canary_rules`) and the replay stops if one parks again;
    ``canary_news`` hears each step. The canary's rules in full: docs/parking.md, "The library".
    """
    seconds = to_seconds(delay)
    wait_seconds = None if canary_wait is None else to_seconds(canary_wait, name="canary_wait")
    poll_seconds = max(to_seconds(canary_poll, name="canary_poll"), 0.05)
    if canary < 0:
        raise ConfigurationError(f"canary={canary} must be zero or more messages")
    target = to_queue or queue
    await prepare_replay_target(channel, topology, target, delay=seconds, dry_run=dry_run)
    action = ReplayAction(
        topology=topology,
        target=target,
        delay=seconds,
        replayed_by=replayed_by,
        publish_timeout=publish_timeout,
    )
    request = MoveRequest(
        queue=queue,
        parking_queue=parking_queue,
        topology=topology,
        where=where,
        limit=limit,
        rate=rate,
        dry_run=dry_run,
        progress=progress,
    )
    if not canary or dry_run:
        return await move(channel, action, request)
    async with CanaryLookout.opened(
        channel,
        exchange=topology.parking_exchange,
        target=target,
        parking=request.parking,
        poll=poll_seconds,
    ) as lookout:
        watched = Canary(
            slots=CanarySlots(size=canary),
            parked_again=lookout.parked_again,
            delay=seconds,
            wait=wait_seconds,
            news=canary_news,
        )
        return await move(channel, action, request, canary=watched)


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
    request = MoveRequest(
        queue=queue,
        parking_queue=parking_queue,
        topology=topology,
        where=where,
        limit=limit,
        rate=rate,
        dry_run=dry_run,
        progress=progress,
    )
    return await move(channel, PurgeAction(), request)
