"""``delayed-retry parking list|show|replay|purge|refresh``: the on-call engineer's parking lot.

Reading never removes anything. Replay, purge and refresh are at-least-once:
a message leaves its place only after its copy is confirmed (replay,
refresh) or the operator confirmed (purge); a failing command moves nothing
more.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from datetime import timedelta
from typing import Any

from delayed_retry.amqp.declare import underlay_of
from delayed_retry.checks import broker_version
from delayed_retry.cli.chain import checked_topology
from delayed_retry.cli.common import add_topology_args, topology_from_args
from delayed_retry.cli.connection import connect
from delayed_retry.cli.main import run
from delayed_retry.cli.output import (
    CommandError,
    UsageError,
    add_json_option,
    confirm,
    count_type,
    duration_type,
    emit_json,
    header_type,
    print_table,
    progress_bar,
    rate_type,
    to_jsonable,
)
from delayed_retry.cli.parking_ids import ambiguous_id, match_ids, no_such_id, resolve_ids
from delayed_retry.durations import format_duration, utcnow
from delayed_retry.headers import (
    BROKER_READ_COUNTERS,
    X_EXCEPTION_TRACEBACK,
    split_read_counters,
)
from delayed_retry.parking.lot import (
    ALL_PARKED,
    CanaryNews,
    MoveProgress,
    MoveReport,
    ParkedFilter,
    ParkedRecord,
    browse_parked,
    group_parked,
    purge_matching,
    replay_matching,
)
from delayed_retry.parking.moves import CANARY_PARKED_AFTER_THE_REST, CANARY_PARKED_AGAIN
from delayed_retry.parking.refresh import refresh_needed, refresh_parked

__all__ = ["register"]


def _add_queue_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", required=True, help="the work queue whose parking lot to use")
    parser.add_argument("--parking-queue", help="parking queue name if not QUEUE.parking")


def _add_filter_args(parser: argparse.ArgumentParser, *, ids: bool = True) -> None:
    group = parser.add_argument_group("which parked messages (all given must match)")
    if ids:
        group.add_argument(
            "--id",
            dest="ids",
            action="append",
            default=[],
            metavar="ID",
            help="a record id as 'parking list' shows it, or its start (repeatable)",
        )
    group.add_argument("--exception", metavar="TYPE", help="exception type, e.g. TimeoutError")
    group.add_argument("--reason", help="parked reason, e.g. max-retries, not-retryable")
    group.add_argument(
        "--older-than", type=duration_type, metavar="AGE", help="parked before, e.g. 2h"
    )
    group.add_argument(
        "--newer-than", type=duration_type, metavar="AGE", help="parked within, e.g. 15m"
    )
    group.add_argument(
        "--header",
        type=header_type,
        action="append",
        default=[],
        metavar="NAME=TEXT",
        help="header NAME contains TEXT (repeatable)",
    )
    group.add_argument("--body-contains", metavar="TEXT", help="the body contains TEXT")
    group.add_argument("--group", metavar="FINGERPRINT", help="a failure group from 'parking list'")


def _filter(args: argparse.Namespace) -> ParkedFilter:
    return ParkedFilter(
        ids=frozenset(getattr(args, "ids", ())),
        exception_type=args.exception,
        reason=args.reason,
        older_than=None if args.older_than is None else timedelta(seconds=args.older_than),
        newer_than=None if args.newer_than is None else timedelta(seconds=args.newer_than),
        headers=tuple(args.header),
        body_contains=args.body_contains,
        fingerprint=args.group,
    )


def register(sub: Any) -> None:
    """Add the parking commands."""
    parking = sub.add_parser(
        "parking",
        help="look at, replay and purge parked messages",
        description="The parking lot of a queue: messages that used up their retries.",
    )
    commands = parking.add_subparsers(dest="parking_command", required=True, metavar="ACTION")

    listing = commands.add_parser(
        "list",
        help="failure groups and parked messages, left in place",
        description="Show the failure groups of a queue's parked messages and a page of their "
        "records (reason, exception, attempts, age). Nothing is removed.",
    )
    _add_queue_args(listing)
    _add_filter_args(listing)
    listing.add_argument(
        "--limit", type=count_type(1), default=20, help="records to show (%(default)s)"
    )
    listing.add_argument(
        "--offset", type=count_type(0), default=0, help="skip this many records first"
    )
    add_json_option(listing)
    add_topology_args(listing)
    listing.set_defaults(func=lambda args: run(_list(args)))

    show = commands.add_parser(
        "show",
        help="one parked message in full: record, headers, body",
        description="Show one parked message: its failure record, traceback, headers and body "
        "(binary bodies as base64). ID may be the start of a record id; when it selects more "
        "than one message (two can share an id), they are listed, and --all shows each. "
        "Nothing is removed.",
    )
    show.add_argument("id", metavar="ID", help="the record id 'parking list' shows, or its start")
    show.add_argument(
        "--all",
        action="store_true",
        help="show every parked message the id selects (without it, more than one is an error)",
    )
    _add_queue_args(show)
    add_json_option(show)
    add_topology_args(show)
    show.set_defaults(func=lambda args: run(_show(args)))

    replay = commands.add_parser(
        "replay",
        help="send parked messages back with a fresh retry budget",
        description="Move parked messages of QUEUE back to QUEUE (or --to) through the delay "
        "chain, with a fresh retry budget. Each leaves the parking queue only after the broker "
        "confirmed its copy. Without --id or a filter, every parked message is replayed, "
        "after a confirmation (--yes without a terminal).",
    )
    _add_queue_args(replay)
    _add_filter_args(replay)
    replay.add_argument("--to", dest="to_queue", help="send to this queue instead of QUEUE")
    replay.add_argument(
        "--limit", type=count_type(0), help="replay at most this many (default: all)"
    )
    replay.add_argument("--rate", type=rate_type, help="at most this many, e.g. 50/s")
    replay.add_argument(
        "--delay", type=duration_type, default=0.0, help="come due after, e.g. 90s, 1h (now)"
    )
    replay.add_argument(
        "--canary",
        type=count_type(0),
        default=0,
        metavar="N",
        help="replay N first; stop if one parks again",
    )
    replay.add_argument(
        "--canary-wait",
        type=duration_type,
        default=None,
        metavar="DURATION",
        help="how long canaries have to park again once due before the rest follows (default: "
        "from their parking records, twice the retry span plus 5s; shorter ones are warned "
        "about)",
    )
    replay.add_argument(
        "--dry-run", action="store_true", help="print what would move; move nothing"
    )
    replay.add_argument(
        "--yes",
        action="store_true",
        help="do not ask for confirmation (asked when an --id selects more than one message, "
        "and before replaying every parked message when no --id or filter is given)",
    )
    add_json_option(replay)
    add_topology_args(replay)
    replay.set_defaults(func=lambda args: run(_replay(args)))

    purge = commands.add_parser(
        "purge",
        help="delete parked messages for good (asks first)",
        description="Delete the selected parked messages. Asks for confirmation unless --yes. "
        "Archive them first ('delayed-retry archive') if anyone may ask for them.",
    )
    _add_queue_args(purge)
    _add_filter_args(purge)
    purge.add_argument("--all", action="store_true", help="select every parked message")
    purge.add_argument("--limit", type=count_type(0), help="purge at most this many")
    purge.add_argument("--rate", type=rate_type, help="at most this many, e.g. 500/s")
    purge.add_argument("--dry-run", action="store_true", help="print what would go; delete nothing")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_json_option(purge)
    add_topology_args(purge)
    purge.set_defaults(func=lambda args: run(_purge(args)))

    refresh = commands.add_parser(
        "refresh",
        help="move long-parked messages to the tail of their parking queue (disk, RabbitMQ < 4.3)",
        description="Move the parked messages of QUEUE that have been in its parking queue "
        "longer than --older-than (since parked, or since their last refresh) to the tail of "
        "the same queue: each original is acked only after the broker confirmed its copy. "
        "Before RabbitMQ 4.3 a quorum queue's log is truncated only up to its oldest "
        "message, so one message parked weeks ago keeps on disk everything parked and "
        "replayed since; once it is refreshed the broker can truncate the log. Records, "
        "ids and bodies do not change; nothing leaves the parking lot.",
    )
    _add_queue_args(refresh)
    refresh.add_argument(
        "--older-than",
        type=duration_type,
        metavar="AGE",
        help="only messages in the parking queue longer than AGE, e.g. 7d (default: all)",
    )
    refresh.add_argument("--limit", type=int, help="refresh at most this many")
    refresh.add_argument("--rate", type=rate_type, help="at most this many, e.g. 500/s")
    refresh.add_argument(
        "--dry-run", action="store_true", help="print what would move; move nothing"
    )
    add_json_option(refresh)
    add_topology_args(refresh)
    refresh.set_defaults(func=lambda args: run(_refresh(args)))


def _age(record: ParkedRecord) -> str:
    age = record.age(now=utcnow())
    return "?" if age is None else format_duration(max(age, timedelta(0)))


def _exception(record: ParkedRecord) -> str:
    if record.exception_type is None:
        return "-"
    short = record.exception_type.rsplit(".", 1)[-1]
    return f"{short}: {record.exception_message}" if record.exception_message else short


PREVIEW_CHARS = 40
"""Characters of a body ``parking list`` shows; ``parking show`` prints it whole."""


def _preview(record: ParkedRecord) -> str:
    """The start of the body on one line, or what it is when it is not text."""
    chunk = record.body[: PREVIEW_CHARS * 4]  # enough bytes for the characters shown
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(chunk) == len(record.body) or exc.start < len(chunk) - 3:
            return f"(binary, {len(record.body)} bytes)"
        text = chunk[: exc.start].decode("utf-8")  # a character cut at the chunk's end
    text = " ".join(text.split())
    if not text:
        return "(empty)" if not record.body else "(blank)"
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _summary(record: ParkedRecord) -> dict[str, Any]:
    data = to_jsonable(record)
    headers, counters = split_read_counters(record.headers)
    data["headers"] = to_jsonable(headers)
    # The broker raises these on every read, this one included: not the message's own.
    data["broker_read_counters"] = to_jsonable(counters)
    data["body"] = to_jsonable(record.body)
    data["age_seconds"] = (
        None if record.parked_at is None else (utcnow() - record.parked_at).total_seconds()
    )
    return dict(data)


async def _list(args: argparse.Namespace) -> int:
    where = _filter(args)
    topology = topology_from_args(args)
    connection = await connect(args.url)
    async with connection:
        channel = await connection.channel()
        if where.ids:
            where, _count, _ambiguous = await resolve_ids(
                channel, args, where, topology=topology, quiet=args.json
            )
        common = dict(queue=args.queue, parking_queue=args.parking_queue, topology=topology)
        groups = await group_parked(channel, where=where, **common)
        page = await browse_parked(
            channel,
            where=where,
            offset=args.offset,
            limit=args.limit,
            **common,
        )
    if args.json:
        emit_json(
            {
                "queue": args.queue,
                "groups": groups,
                "records": [_summary(r) for r in page.records],
                "next_offset": page.next_offset,
            }
        )
        return 0
    if not groups:
        print(f"no parked messages for {args.queue!r}" + ("" if where.is_empty else " match"))
        return 0
    now = utcnow()
    print(f"failure groups of {args.queue!r} ({sum(g.count for g in groups)} messages):")
    print_table(
        ("group", "count", "reason", "oldest", "failure"),
        [
            (
                g.fingerprint,
                g.count,
                g.reason,
                "?" if g.oldest_parked_at is None else format_duration(now - g.oldest_parked_at),
                g.failure if g.exception_type else f"(no failure record) {g.example.body_preview}",
            )
            for g in groups
        ],
        right=(1,),
    )
    print()
    print_table(
        ("id", "age", "reason", "attempts", "exception", "body"),
        [(r.id, _age(r), r.reason, r.attempts, _exception(r), _preview(r)) for r in page.records],
        right=(3,),
    )
    more = f"; next page: --offset {page.next_offset}" if page.next_offset is not None else ""
    print(f"{len(page.records)} shown from offset {page.offset}{more}; nothing was removed")
    return 0


SHOW_AT_MOST = 20
"""Messages ``parking show --all`` prints at most; give more of the id for the rest."""


async def _show(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    connection = await connect(args.url)
    async with connection:
        channel = await connection.channel()
        (match,) = await match_ids(
            channel, args, [args.id], where=ALL_PARKED, topology=topology, keep=SHOW_AT_MOST
        )
    if not match.found:
        raise no_such_id(match, args.queue)
    if match.ambiguous and not args.all:
        raise ambiguous_id(match, args.queue)
    records = match.records
    if args.json:
        emit_json(_summary(records[0]) if not args.all else [_summary(r) for r in records])
    else:
        for n, record in enumerate(records, 1):
            if args.all:
                print(f"{'' if n == 1 else chr(10)}-- parked message {n} of {match.count} --")
            _print_record(record)
    if match.count > len(records):
        print(
            f"{match.count - len(records)} more parked message(s) match {args.id!r}; "
            "give more of the id to see them",
            file=sys.stderr,
        )
    return 0


def _print_record(record: ParkedRecord) -> None:
    rows = [
        ("id", record.id),
        ("message id", record.message_id),
        ("queue", record.queue),
        ("reason", record.reason),
        ("exception", record.exception_type),
        ("message", record.exception_message),
        ("attempts", record.attempts),
        ("first failure", record.first_failure_at),
        ("parked", f"{record.parked_at} ({_age(record)} ago)"),
        ("replayed", f"{record.replays} time(s)"),
        ("refreshed", record.refreshed_at),
        ("group", record.fingerprint),
        ("from", f"exchange {record.original_exchange!r} key {record.original_routing_key!r}"),
        ("content type", record.content_type),
    ]
    for name, value in rows:
        print(f"{name:>14}: {'-' if value is None else value}")
    headers, counters = split_read_counters(record.headers)
    print("       headers:")
    for key, value in sorted(headers.items()):
        if key != X_EXCEPTION_TRACEBACK:
            print(f"    {key} = {to_jsonable(value)!r}")
    if counters:
        print(f"{'read counts':>14}: written by RabbitMQ on every read, this one included")
        for key, value in counters.items():
            print(f"    {key} = {to_jsonable(value)!r}  ({BROKER_READ_COUNTERS[key]})")
    if record.traceback:
        print("     traceback:")
        print("    " + record.traceback.rstrip().replace("\n", "\n    "))
    body = to_jsonable(record.body)
    print(f"          body ({len(record.body)} bytes):")
    if isinstance(body, str):
        print(body)
    else:
        print(f"(binary, base64) {body['base64']}")


def _who() -> str | None:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):
        return None


def _reporter(args: argparse.Namespace, update: Any) -> Any:
    def progress(step: MoveProgress) -> None:
        update(step.scanned, step.depth)
        if step.dry_run and step.record is not None and not args.json:
            r = step.record
            print(f"would {step.action} {r.id}  {r.reason}  {_exception(r)}")

    return progress


def _report(report: MoveReport, args: argparse.Namespace) -> int:
    if args.json:
        emit_json(report)
    verb = {"replay": "replayed", "purge": "purged", "refresh": "refreshed"}[report.action]
    if report.dry_run:
        line = f"dry run: would have {verb} {report.done} of {report.scanned} parked message(s)"
    else:
        line = f"{verb} {report.done} message(s) of {report.scanned} looked at"
        if report.to_queue:
            tail = "the tail of " if report.action == "refresh" else ""
            line += f" to {tail}{report.to_queue!r}"
    if not args.json:
        print(line)
    if CANARY_PARKED_AGAIN in (report.stopped, report.canary_verdict):
        raise CommandError(
            f"a canary parked again ({', '.join(report.canary_ids)}): the replay stopped after "
            f"{report.done}; the rest stay parked. Fix the cause, then replay again"
        )
    if report.canary_verdict == CANARY_PARKED_AFTER_THE_REST:
        rest = report.done - len(report.canary_ids)
        raise CommandError(
            f"a canary parked again ({', '.join(report.canary_ids)}) after the other {rest} "
            f"were replayed: they are probably failing too. See 'delayed-retry parking list "
            f"--queue {args.queue}'; fix the cause, then replay again"
        )
    return 0


def _canary_news(news: CanaryNews) -> None:
    """Tell the operator on stderr what the canaries are doing (stdout keeps the report)."""
    until = f"{news.until:%H:%M:%S} UTC" if news.until is not None else "?"
    ids = ", ".join(news.ids)
    if news.phase == "watching":
        if news.wait.short:
            print(f"warning: {news.wait.warning()}", file=sys.stderr)
        print(
            f"canary {ids} replayed; watching it until {until} before the rest "
            f"({news.wait.describe()})",
            file=sys.stderr,
        )
    elif news.phase == "passed":
        print(f"canary {ids} did not park again; replaying the rest", file=sys.stderr)
    elif news.phase == "confirming":
        print(
            f"not confirmed yet: the canary can still park again; watching it until {until}",
            file=sys.stderr,
        )
    elif news.phase == "confirmed":
        print(f"canary {ids} confirmed: it did not park again", file=sys.stderr)


async def _replay(args: argparse.Namespace) -> int:
    where = _filter(args)
    limit = args.limit
    connection = await connect(args.url)
    async with connection:
        topology = await checked_topology(connection, args, queue=args.to_queue or args.queue)
        channel = await connection.channel()
        if where.ids:
            where, selected, ambiguous = await resolve_ids(
                channel, args, where, topology=topology, quiet=args.json
            )
            limit = selected if limit is None else min(limit, selected)
            question = (
                f"replay {limit} parked message(s) of {args.queue!r} (an --id selects more "
                "than one)?"
            )
            if ambiguous and not args.dry_run and not confirm(question, assume_yes=args.yes):
                print("nothing replayed", file=sys.stderr)
                return 1
        elif where.is_empty and not args.dry_run:
            # The whole lot, unfiltered: asked like a purge, with the count it is.
            preview = await replay_matching(
                channel,
                queue=args.queue,
                parking_queue=args.parking_queue,
                to_queue=args.to_queue,
                where=where,
                limit=limit,
                dry_run=True,
                topology=topology,
            )
            if preview.done == 0:
                print(f"no parked messages of {args.queue!r}; nothing replayed")
                return 0
            limit = preview.done
            question = (
                f"replay all {limit} parked message(s) of {args.queue!r} (no --id or filter "
                "selects fewer)?"
            )
            if not confirm(question, assume_yes=args.yes):
                print("nothing replayed", file=sys.stderr)
                return 1
        with progress_bar("replay", total=None, enabled=None if not args.json else False) as bar:
            report = await replay_matching(
                channel,
                queue=args.queue,
                parking_queue=args.parking_queue,
                to_queue=args.to_queue,
                where=where,
                limit=limit,
                rate=args.rate,
                delay=args.delay,
                canary=args.canary,
                canary_wait=args.canary_wait,
                canary_news=_canary_news,
                dry_run=args.dry_run,
                progress=_reporter(args, bar),
                replayed_by=_who(),
                topology=topology,
            )
    return _report(report, args)


async def _purge(args: argparse.Namespace) -> int:
    where = _filter(args)
    if where.is_empty and not args.all:
        raise UsageError(
            "parking purge needs a selection: --id, a filter (--exception, --reason, "
            "--older-than, ...) or --all"
        )
    topology = topology_from_args(args)
    connection = await connect(args.url)
    async with connection:
        channel = await connection.channel()
        selected: int | None = None
        if where.ids:
            where, selected, _ambiguous = await resolve_ids(
                channel, args, where, topology=topology, quiet=args.json
            )
            selected = selected if args.limit is None else min(selected, args.limit)
        common: dict[str, Any] = dict(
            queue=args.queue, parking_queue=args.parking_queue, where=where, topology=topology
        )
        if not args.dry_run:
            if selected is None:
                preview = await purge_matching(channel, dry_run=True, limit=args.limit, **common)
                selected = preview.done
            if selected == 0:
                print(f"no parked messages of {args.queue!r} match; nothing purged")
                return 0
            question = f"delete {selected} parked message(s) of {args.queue!r} for good?"
            if not confirm(question, assume_yes=args.yes):
                print("nothing purged", file=sys.stderr)
                return 1
        with progress_bar("purge", total=None, enabled=None if not args.json else False) as bar:
            # The count the operator agreed to, never more (a message parked meanwhile stays).
            report = await purge_matching(
                channel,
                limit=args.limit if selected is None else selected,
                rate=args.rate,
                dry_run=args.dry_run,
                progress=_reporter(args, bar),
                **common,
            )
    return _report(report, args)


async def _refresh(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit takes zero or more messages")
    topology = topology_from_args(args)
    connection = await connect(args.url)
    async with connection:
        channel = await connection.channel()
        underlay = await underlay_of(channel)
        version = broker_version(getattr(underlay.connection, "server_properties", None))
        if not refresh_needed(version):
            assert version is not None
            print(
                f"note: RabbitMQ {version[0]}.{version[1]} truncates a quorum queue's log past "
                "long-held messages itself; refreshing frees no disk there",
                file=sys.stderr,
            )
        with progress_bar("refresh", total=None, enabled=None if not args.json else False) as bar:
            report = await refresh_parked(
                channel,
                queue=args.queue,
                parking_queue=args.parking_queue,
                older_than=args.older_than,
                limit=args.limit,
                rate=args.rate,
                dry_run=args.dry_run,
                progress=_reporter(args, bar),
                topology=topology,
            )
    return _report(report, args)
