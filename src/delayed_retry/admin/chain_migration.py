"""Move messages waiting in another delay chain into ours, for their remaining delay.

At-least-once, message by message: take one from a source level queue
(``basic.get``, unacked), publish it into the target chain with a publisher
confirm, and only then ack it in the source. A message that cannot move (no
destination, an unreadable key) is returned to its source queue with
``nack(requeue=True)`` and keeps waiting there as before; a crash in between
gives a duplicate, never a loss. Levels are drained highest first, in passes,
until a pass moves nothing, since the source keeps dead-lettering messages
downward meanwhile. See :mod:`delayed_retry.admin.other_chains` for due times.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiormq
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from delayed_retry.admin.chain_probe import queue_depth
from delayed_retry.admin.other_chains import SourceChain, plan_move
from delayed_retry.amqp import publish as publishing
from delayed_retry.amqp.channels import close_quietly, underlay_channel
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import ConfigurationError, DelayedRetryError, PublishError
from delayed_retry.headers.names import X_DUE_AT, X_MIGRATED_FROM
from delayed_retry.headers.values import sanitize_headers

__all__ = ["LevelReport", "MigrationReport", "migrate_chain", "source_depths"]

log = logging.getLogger(__name__)

MAX_PASSES = 3
"""Passes over the levels: the first moves almost everything; later ones catch what the source
dead-lettered into an already drained level meanwhile. Few, because every pass hands a message
that cannot move back to its queue once more, and RabbitMQ 4.x counts that toward a quorum
queue's delivery limit."""


@dataclass
class LevelReport:
    """What happened to one source level."""

    level: int
    queue: str
    moved: int = 0
    left: int = 0
    problems: dict[str, int] = field(default_factory=dict)


@dataclass
class MigrationReport:
    """The whole migration: per level, and in total."""

    levels: dict[int, LevelReport] = field(default_factory=dict)

    @property
    def moved(self) -> int:
        return sum(r.moved for r in self.levels.values())

    @property
    def left(self) -> int:
        return sum(r.left for r in self.levels.values())


async def source_depths(
    connection: AbstractConnection, source: SourceChain
) -> list[tuple[int, str, int | None]]:
    """(level, queue, messages or ``None`` when missing) for every level of ``source``."""
    return [
        (level, source.level_name(level), await queue_depth(connection, source.level_name(level)))
        for level in range(source.levels)
    ]


async def migrate_chain(
    connection: AbstractConnection,
    *,
    source: SourceChain,
    target: DelayTopology,
    destinations: Mapping[str, str] | None = None,
    default_destination: str | None = None,
    publish_timeout: float = publishing.DEFAULT_PUBLISH_TIMEOUT,
    on_move: Callable[[int], None] | None = None,
) -> MigrationReport:
    """Move every message of ``source`` into ``target``, re-scheduled, never early.

    The routing key's tail names the destination queue (ours, NServiceBus) or
    the original routing key (Kombu): ``destinations`` maps tails to queues
    and ``default_destination`` takes the rest; without either, the tail itself
    is the queue. A destination must exist; it is bound to ``target``'s end.
    """
    if source.level_name(0) == target.level_name(0):
        raise ConfigurationError(
            f"the source and target chains are the same ({target.level_name(0)!r}); "
            "pass the target's topology options and the source's --from options"
        )
    channel = await connection.channel()  # publisher confirms on
    underlay = await underlay_channel(channel)
    declarer = declarer_for(underlay.connection)
    await declarer.topology(underlay.connection, target)
    bound: dict[str, str | None] = {}  # destination -> problem (None: bound)
    report = MigrationReport()
    try:
        for pass_number in range(MAX_PASSES):
            moved_this_pass = 0
            for level in range(source.levels - 1, -1, -1):
                name = source.level_name(level)
                level_report = report.levels.setdefault(level, LevelReport(level, name))
                depth = await queue_depth(connection, name)
                if not depth:
                    continue
                queue = await channel.get_queue(name, ensure=False)
                # Messages that cannot move are held unacked until the level is scanned, so
                # the next get reaches the message behind them, then all go back at once.
                held: list[AbstractIncomingMessage] = []
                for _ in range(depth):
                    message = await queue.get(no_ack=False, fail=False)
                    if message is None:
                        break
                    problem = await _move(
                        message,
                        level=level,
                        source=source,
                        target=target,
                        destinations=destinations or {},
                        default_destination=default_destination,
                        bound=bound,
                        declare=functools.partial(
                            declarer.destination, underlay.connection, target, with_parking=False
                        ),
                        timeout=publish_timeout,
                    )
                    if problem is None:
                        level_report.moved += 1
                        moved_this_pass += 1
                        if on_move is not None:
                            on_move(1)
                    else:
                        held.append(message)
                        if pass_number == 0:  # later passes meet the same messages again
                            count = level_report.problems.get(problem, 0)
                            level_report.problems[problem] = count + 1
                for message in held:
                    await message.nack(requeue=True)
            if moved_this_pass == 0:
                break
        for level_report in report.levels.values():
            level_report.left = await queue_depth(connection, level_report.queue) or 0
    finally:
        await close_quietly(channel)
    return report


async def _move(
    message: AbstractIncomingMessage,
    *,
    level: int,
    source: SourceChain,
    target: DelayTopology,
    destinations: Mapping[str, str],
    default_destination: str | None,
    bound: dict[str, str | None],
    declare: Callable[[str], Awaitable[None]],
    timeout: float,
) -> str | None:
    """Move one message; return ``None`` when moved (and acked), else why it stays."""
    now = utcnow()
    plan = plan_move(
        source,
        level=level,
        routing_key=message.routing_key or "",
        headers=message.headers,
        now=now,
    )
    if plan.problem is not None or plan.tail is None or plan.due_at is None:
        return await _stays(message, plan.problem or "unreadable routing key")
    queue = destinations.get(plan.tail, default_destination)
    if queue is None:
        if source.tail == "routing-key":
            return await _stays(
                message, f"no destination queue for routing key {plan.tail!r} (--to or --map)"
            )
        queue = plan.tail
    if queue not in bound:
        try:
            target.check_destination(queue)
            await declare(queue)
            bound[queue] = None
        except DelayedRetryError as exc:
            bound[queue] = f"destination {queue!r} unusable: {exc}"
    if bound[queue] is not None:
        return await _stays(message, str(bound[queue]))
    try:
        units = target.units_until(plan.due_at, now=utcnow())
    except DelayedRetryError:
        return await _stays(message, f"due beyond the target chain's {target.max_delay}")
    route = target.route(units, queue)
    headers = sanitize_headers(message.headers)
    headers[X_DUE_AT] = to_epoch_ms(plan.due_at)
    headers[X_MIGRATED_FROM] = source.level_name(level)
    try:
        await publishing.publish_copy(
            message.channel,
            message,
            exchange=route.exchange,
            routing_key=route.routing_key,
            headers=headers,
            timeout=timeout,
        )
    except (PublishError, aiormq.exceptions.AMQPError, ConnectionError):
        # Stop here: the channel closes and returns this message (and any held) unmoved.
        raise
    await message.ack()
    return None


async def _stays(message: AbstractIncomingMessage, problem: str) -> str:
    """Note why a message cannot move; the caller returns it to its source queue."""
    log.warning("message %s stays in the source chain: %s", message.message_id, problem)
    return problem
