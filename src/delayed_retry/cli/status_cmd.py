"""``delayed-retry status``: what waits where, and when it comes due."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any

from aio_pika.abc import AbstractConnection

from delayed_retry.admin.chain_due import DueTimes, peek_due_times, peeks_are_safe
from delayed_retry.admin.chain_probe import declared_queue
from delayed_retry.cli import common, output
from delayed_retry.cli.chain import checked_topology
from delayed_retry.cli.command import Command
from delayed_retry.cli.connection import connect
from delayed_retry.cli.leaders import ChainLeaders, read_chain_leaders
from delayed_retry.cli.work_queue import check_work_queue
from delayed_retry.durations import format_duration, utcnow
from delayed_retry.errors import NotFoundError, queue_not_found
from delayed_retry.recovery.throttle import marker_queue_name

__all__ = ["COMMAND"]


def _options(parser: argparse.ArgumentParser) -> None:
    common.add_queues_option(
        parser, help="a work queue to show with its parking queue (repeatable)"
    )
    parser.add_argument("--all-levels", action="store_true", help="also show empty levels")
    parser.add_argument(
        "--no-peek",
        action="store_true",
        help="do not read the waiting messages' due times; show each level's bound only",
    )
    output.add_json_option(parser)
    common.add_topology_args(parser)
    common.add_management_option(
        parser, purpose="the chain a --queue is bound to and its delivery limit's checks"
    )


async def _declared(connection: AbstractConnection, name: str) -> tuple[int, int] | None:
    """(messages, consumers) of queue ``name``, or ``None`` when it does not exist."""
    result = await declared_queue(connection, name)
    if result is None:
        return None
    return int(result.message_count or 0), int(result.consumer_count or 0)


def _at(found: tuple[int, int] | None, index: int) -> int | None:
    return None if found is None else found[index]


def _shown(found: tuple[int, int] | None, index: int, absent: str) -> int | str:
    return absent if found is None else found[index]


async def _status(args: argparse.Namespace) -> int:
    connection = await connect(args.url)
    async with connection:
        topology = await checked_topology(
            connection, args, queue=args.queue[0] if args.queue else None
        )
        work = {q: await _declared(connection, q) for q in args.queue}
        parking = {
            q: await _declared(connection, topology.default_parking_queue(q)) for q in args.queue
        }
        checks = {q: await check_work_queue(args, connection, q) for q in args.queue}
        dead_letter = {
            q: await _declared(
                connection,
                checks[q].dead_letter_queue or topology.default_dead_letter_queue(q),
            )
            for q in args.queue
        }
        warnings = [c.warning for c in checks.values() if c.warning is not None]
        # Each consumer process whose throttle has tripped consumes this queue until it resumes.
        throttled = {
            q: _at(await _declared(connection, marker_queue_name(topology.prefix, q)), 1) or 0
            for q in args.queue
        }
        levels = [
            await _declared(connection, topology.level_name(n)) for n in range(topology.levels)
        ]
        unroutable = await _declared(connection, topology.unroutable_queue)
        alerts = await _declared(connection, topology.alerts_queue)
        peek = not args.no_peek and await peeks_are_safe(connection, topology)
        due = {
            n: await peek_due_times(connection, topology.level_name(n))
            for n, found in enumerate(levels)
            if peek and found is not None and found[0]
        }
    leaders = await read_chain_leaders(args, topology)
    if leaders.warning is not None:
        warnings.append(leaders.warning)
    now = utcnow()
    unit = topology.unit_ms / 1000
    level_rows: list[dict[str, Any]] = []
    for n, found in enumerate(levels):
        # A message in level n still has the rest of that level and at most every lower one.
        level_rows.append(
            {
                "level": n,
                "queue": topology.level_name(n),
                "holds_seconds": (1 << n) * unit,
                "due_within_seconds": ((1 << (n + 1)) - 1) * unit,
                "messages": None if found is None else found[0],
                **_due_fields(due.get(n), now=now),
                **_leader_fields(leaders, topology.level_name(n)),
            }
        )
    missing = [r["queue"] for r in level_rows if r["messages"] is None]
    missing += [topology.unroutable_queue] if unroutable is None else []
    missing += [q for q, found in work.items() if found is None]
    if args.json:
        output.emit_json(
            {
                "prefix": topology.prefix,
                "levels": topology.levels,
                "unit_seconds": unit,
                "max_delay_seconds": topology.max_delay.total_seconds(),
                "queues": [
                    {
                        "queue": q,
                        "messages": _at(work[q], 0),
                        "consumers": _at(work[q], 1),
                        "parked": _at(parking[q], 0),
                        "dead_lettered": _at(dead_letter[q], 0),
                        "warning": checks[q].warning,
                        "throttled_consumers": throttled[q],
                    }
                    for q in args.queue
                ],
                "chain": level_rows,
                "unroutable": None if unroutable is None else unroutable[0],
                "alert_copies": None if alerts is None else alerts[0],
                "missing": missing,
                "leaders_per_node": None
                if leaders.spread is None
                else dict(leaders.spread.per_node),
                "leaders_unread": leaders.unread,
            }
        )
        _raise_missing(work, missing)
        return 0
    print(
        f"delay chain {topology.prefix!r}: {topology.levels} levels of "
        f"{format_duration(unit)}, delays up to {format_duration(topology.max_delay)} "
        f"({topology.queue_type} queues)"
    )
    if args.queue:
        print()
        output.print_table(
            ("queue", "ready", "consumers", "throttled", "parked", "dead-lettered"),
            [
                (
                    q,
                    _shown(work[q], 0, "missing"),
                    _shown(work[q], 1, "-"),
                    throttled[q],
                    _shown(parking[q], 0, "missing"),
                    _shown(dead_letter[q], 0, "-"),
                )
                for q in args.queue
            ],
            right=(1, 2, 3, 4),
        )
    waiting = sum(r["messages"] or 0 for r in level_rows)
    shown = [r for r in level_rows if args.all_levels or r["messages"]]
    print()
    if shown:
        # The leader column only where the management API told where leaders are.
        read = leaders.spread is not None
        output.print_table(
            ("level", "holds", "messages", "due", *(("leader (members)",) if read else ())),
            [
                (
                    r["queue"],
                    format_duration(r["holds_seconds"]),
                    "missing" if r["messages"] is None else r["messages"],
                    _due_cell(r, due.get(r["level"]), now=now, peeked=peek),
                    *((_leader_cell(r),) if read else ()),
                )
                for r in shown
            ],
            right=(2,),
        )
    print(
        f"{waiting} message(s) waiting in the chain"
        + ("" if args.all_levels else " (empty levels hidden; --all-levels shows them)")
    )
    print(
        f"unroutable: {'missing' if unroutable is None else unroutable[0]}, alert copies: "
        f"{'missing' if alerts is None else alerts[0]}"
    )
    print(_leaders_line(leaders))
    for warning in warnings:
        print(f"delayed-retry: warning: {warning}", file=sys.stderr, flush=True)
    _raise_missing(work, missing)
    return 0


def _leader_fields(leaders: ChainLeaders, queue: str) -> dict[str, Any]:
    """A level's ``leader`` and ``members`` in the JSON output (``None`` when not read)."""
    if leaders.spread is None:
        return {"leader": None, "members": None}
    return {
        "leader": leaders.spread.levels.get(queue),
        "members": list(leaders.members.get(queue, ())),
    }


def _leader_cell(row: dict[str, Any]) -> str:
    """``node-a (a, b, c)``: a level's leader and members, ``-`` when not read."""
    if row["leader"] is None:
        return "no leader"
    members = ", ".join(row["members"] or ())
    return f"{row['leader']} ({members})" if members else str(row["leader"])


def _leaders_line(leaders: ChainLeaders) -> str:
    """``level leaders per node: a 12, b 12, c 12``, or why they are not shown."""
    if leaders.spread is None:
        return "level leaders per node: not read (the management API did not answer)"
    counts = ", ".join(f"{node} {led}" for node, led in leaders.spread.per_node.items())
    return f"level leaders per node: {counts or 'none reported'}"


def _due_fields(times: DueTimes | None, *, now: datetime) -> dict[str, Any]:
    """The JSON fields of a level's due times as read (``None`` when not read)."""
    if times is None or times.known == 0:
        return {"due_in_seconds": None, "due_read": 0 if times is None else times.read}
    assert times.earliest is not None and times.latest is not None
    return {
        "due_in_seconds": {
            "earliest": max((times.earliest - now).total_seconds(), 0.0),
            "latest": max((times.latest - now).total_seconds(), 0.0),
        },
        "due_read": times.read,
    }


def _due_cell(row: dict[str, Any], times: DueTimes | None, *, now: datetime, peeked: bool) -> str:
    """When a level's messages come due: exact from their headers, else the level's bound."""
    if not row["messages"]:
        return "-"
    bound = f"within {output.format_at_most(row['due_within_seconds'])}"
    if times is None or times.known == 0:
        why = "level bound" if peeked else "level bound, not read"
        return f"{bound} ({why})"
    assert times.earliest is not None and times.latest is not None
    first = _due_in(times.earliest, now)
    last = _due_in(times.latest, now)
    text = f"in {first}" if first == last else f"in {first} to {last}"
    notes = []
    if times.read < row["messages"]:
        notes.append(f"first {times.read} read")
    if times.unknown:
        notes.append(f"{times.unknown} without a due time")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _due_in(moment: datetime, now: datetime) -> str:
    seconds = (moment - now).total_seconds()
    return "now" if seconds < 1 else format_duration(round(seconds))


def _raise_missing(work: dict[str, tuple[int, int] | None], missing: list[str]) -> None:
    """Fail (exit 1) naming a missing queue, with the fix that is true for its kind.

    A work queue the user named is created by its consumer (or ``declare --create``);
    the chain's own queues by ``declare``.
    """
    named = [q for q, found in work.items() if found is None]
    if named:
        others = f"; also missing: {', '.join(named[1:])}" if named[1:] else ""
        raise NotFoundError(queue_not_found(named[0]) + others)
    if missing:
        raise output.CommandError(
            f"{len(missing)} queue(s) of the delay chain are missing ({', '.join(missing[:3])}"
            f"{', …' if len(missing) > 3 else ''}); run 'delayed-retry declare' with the same "
            "options to create them"
        )


COMMAND = Command(
    name="status",
    help="work queues, delay levels, parking: depths and when messages come due",
    description="Show each work queue's depth and consumers, the messages waiting in the "
    "delay chain (only the levels holding any, unless --all-levels) with when they come "
    "due, and the parking, unroutable and alert queues. Where the management API "
    "answers, warns about a work queue that a message the client cannot decode would "
    "stall (no delivery limit with a dead-letter target). Read-only. When they come due is "
    "read from the messages' own due time (x-retry-due-at): the first 100 of each level "
    "are taken and given back at once. Where that is not done (RabbitMQ 4.x quorum "
    "levels, where each return counts toward the broker's delivery limit, or "
    "--no-peek) or a message has no due time of its own, the level's bound is shown: "
    "due within 2^(level+1) - 1 units.",
    options=_options,
    run=_status,
)
