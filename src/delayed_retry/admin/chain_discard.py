"""Discard, park or expedite chosen messages waiting in the delay chain, leaving the others.

Use :func:`discard_waiting` when one scheduled message (or a retry copy, or everything waiting
for one queue) must not arrive: a reminder cancelled, a retry no longer wanted.
``delayed-retry teardown --discard-waiting`` is the other way out, for the whole chain at once.
Use :func:`expedite_waiting` when they should arrive now instead: the bug a retry waits out is
fixed ("retry now"). How the scan keeps the others never early and nothing else lost:
docs/scheduling.md, "Cancelling a scheduled message".
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiormq
import aiormq.abc

from delayed_retry.admin.level_reads import HeldReads
from delayed_retry.admin.waiting import (
    READ_BUDGET,
    WaitingMessage,
    WaitingSelection,
    discarded_headers,
    expedited_headers,
    over_read_budget,
    read_waiting,
    reads_are_counted,
)
from delayed_retry.amqp.channels import scratch_channel, underlay_channel
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import utcnow
from delayed_retry.errors import ConfigurationError, NotFoundError, ReadsCountedError
from delayed_retry.parking.moving.actions import copy_then_ack
from delayed_retry.rabbitmq.versions import broker_major_version

__all__ = ["DiscardReport", "discard_waiting", "expedite_waiting"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class DiscardReport:
    """What a discard looked at and took out of the chain."""

    action: Literal["discard", "park", "expedite"]
    dry_run: bool
    scanned: int = 0
    """Waiting messages read (a message that moved down a level meanwhile counts twice)."""
    selected: list[WaitingMessage] = field(default_factory=list)
    """The messages selected, in the order read (acted on unless ``dry_run``)."""
    unmatched: tuple[str, ...] = ()
    """Ids given that selected no waiting message (empty when the limit stopped the scan)."""
    parked_to: list[str] = field(default_factory=list)
    """The parking queues the selected messages went to (``park``), without repeats."""
    delivered_to: list[str] = field(default_factory=list)
    """The queues the selected messages were delivered to (``expedite``), without repeats."""
    seconds: float = 0.0
    """How long the scan held the messages it read (how late the others can be)."""

    @property
    def done(self) -> int:
        """Messages taken out of the chain (or that would be, in a dry run)."""
        return len(self.selected)


async def discard_waiting(
    channel: Any,
    *,
    ids: tuple[str, ...] | frozenset[str] = (),
    queue: str | None = None,
    park: bool = False,
    dry_run: bool = False,
    limit: int | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
) -> DiscardReport:
    """Take the waiting messages with these ``ids`` (and/or due to ``queue``) out of the chain.

    ``ids`` are whole ids (a ``message_id``, or ``sha256:…``, as the dry run lists them);
    ``queue`` restricts the selection, or alone selects every message due to it. ``park``
    parks them with reason ``discarded`` instead of deleting them, each confirmed before it
    leaves; ``dry_run`` takes nothing; ``limit`` stops after that many. Raises
    :class:`~delayed_retry.errors.NotFoundError` for a missing level queue,
    :class:`~delayed_retry.errors.ConfigurationError` for an empty selection, and
    :class:`~delayed_retry.errors.ReadsCountedError` at a message another return could move on
    early (see :data:`~delayed_retry.admin.waiting.READ_BUDGET`).
    """
    return await _take_waiting(
        channel,
        WaitingSelection(ids=frozenset(ids), queue=queue),
        DiscardReport(action="park" if park else "discard", dry_run=dry_run),
        limit=limit,
        topology=topology,
        publish_timeout=publish_timeout,
    )


async def expedite_waiting(
    channel: Any,
    *,
    ids: tuple[str, ...] | frozenset[str] = (),
    queue: str | None = None,
    dry_run: bool = False,
    limit: int | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
) -> DiscardReport:
    """Deliver the waiting messages with these ``ids`` (and/or due to ``queue``) now.

    "Retry now": use it when what a retry waits out is fixed, or a scheduled message is
    wanted early. Each selected message is published to its destination queue, due now,
    with its retry count and failure record unchanged (the consumer sees the attempt it
    would have seen), and leaves the chain only once that copy is confirmed: a crash in
    between may deliver it twice, never lose it. Selection, ``dry_run``, ``limit``, the
    promise to the others and the errors are :func:`discard_waiting`'s.
    """
    return await _take_waiting(
        channel,
        WaitingSelection(ids=frozenset(ids), queue=queue),
        DiscardReport(action="expedite", dry_run=dry_run),
        limit=limit,
        topology=topology,
        publish_timeout=publish_timeout,
    )


async def _take_waiting(
    channel: Any,
    selection: WaitingSelection,
    report: DiscardReport,
    *,
    limit: int | None,
    topology: DelayTopology,
    publish_timeout: float,
) -> DiscardReport:
    """Scan the chain from the top down and take what ``selection`` selects, as ``report`` says."""
    if limit is not None and limit < 0:
        raise ConfigurationError(f"limit={limit} must be zero or more")
    dry_run = report.dry_run
    underlay = await underlay_channel(channel)
    connection = underlay.connection
    counted = reads_are_counted(
        broker_major=broker_major_version(getattr(connection, "server_properties", None)),
        queue_type=topology.queue_type,
    )
    async with scratch_channel(connection, confirms=report.action != "discard") as own:
        for level in range(topology.levels):
            await _check_level(own, topology, level)
        reads = HeldReads(own)
        too_often: WaitingMessage | None = None
        start = time.monotonic()
        try:
            for level in reversed(range(topology.levels)):
                async for got in reads.read(topology.level_name(level)):
                    props = got.header.properties
                    message = read_waiting(
                        props.headers,
                        message_id=props.message_id,
                        body=got.body,
                        routing_key=got.routing_key or "",
                        level=level,
                        levels=topology.levels,
                    )
                    report.scanned += 1
                    if over_read_budget(message, counted=counted):
                        too_often = message
                        break
                    if not selection.matches(message):
                        continue
                    if limit is not None and report.done >= limit:
                        break
                    report.selected.append(message)
                    if dry_run:
                        continue
                    await _take_out(own, got, message, topology, publish_timeout, report)
                    reads.settled(got.delivery_tag or 0)
                    if limit is not None and report.done >= limit:
                        break
                if too_often is not None or (limit is not None and report.done >= limit):
                    break
        finally:
            # A closed channel gave them back already (counted on 4.x: rare, see READ_BUDGET).
            await reads.give_back()
            report.seconds = time.monotonic() - start
    if too_often is not None:
        raise ReadsCountedError(
            f"message {too_often.id} in level queue {topology.level_name(too_often.level)!r} "
            f"was returned {too_often.returns} times already (x-delivery-count); RabbitMQ 4.x "
            "counts returns toward a quorum queue's delivery limit (20 unless set; 4.0-4.2 "
            "count every return, 4.3 only those of a closed channel), past which a level sends "
            f"a message on early, so a scan of the chain stops reading at {READ_BUDGET}: "
            f"{report.done} selected message(s) read before it were taken out, none after. Let "
            "the messages come due, or move to RabbitMQ 4.3, where these reads do not count"
        )
    if limit is None or report.done < limit:
        # Stopped at the limit, the scan did not look at every waiting message.
        report.unmatched = selection.unmatched(report.selected)
    log.info(
        "%s%s %d of %d waiting message(s) read in the delay chain %r in %.3f s",
        "dry run: would " if dry_run else "",
        report.action,
        report.done,
        report.scanned,
        topology.prefix,
        report.seconds,
    )
    return report


async def _check_level(
    own: aiormq.abc.AbstractChannel, topology: DelayTopology, level: int
) -> None:
    name = topology.level_name(level)
    try:
        await own.queue_declare(name, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise NotFoundError(
            f"level queue {name!r} of the delay chain {topology.prefix!r} does not exist in "
            "this vhost, so no message waits there; pass the --prefix and --levels your "
            "consumers use, or check the vhost in the URL"
        ) from exc


async def _take_out(
    own: aiormq.abc.AbstractChannel,
    got: aiormq.abc.DeliveredMessage,
    message: WaitingMessage,
    topology: DelayTopology,
    publish_timeout: float,
    report: DiscardReport,
) -> None:
    """Ack ``got`` (discard); or copy it to its parking queue (park) or to its destination
    (expedite), confirmed, then ack."""
    if report.action == "discard":
        await own.basic_ack(got.delivery_tag or 0)
        return
    if message.destination is None:
        where = "no parking queue to go to" if report.action == "park" else "nowhere to go now"
        raise ConfigurationError(
            f"waiting message {message.id} has routing key {got.routing_key!r}, which names no "
            f"destination queue, so it has {where}; let it come due, or discard it without --park"
        )
    headers = got.header.properties.headers
    if report.action == "expedite":
        to, sent_to = message.destination, report.delivered_to
        copy = expedited_headers(headers, now=utcnow())
    else:
        to, sent_to = topology.default_parking_queue(message.destination), report.parked_to
        copy = discarded_headers(headers, destination=message.destination, now=utcnow())
        # A queue scheduled to with publish_delayed may never have had a parking queue.
        await declarer_for(own.connection).parking(own.connection, topology, message.destination)
    await copy_then_ack(
        own, got, exchange="", routing_key=to, headers=copy, timeout=publish_timeout
    )
    if to not in sent_to:
        sent_to.append(to)
