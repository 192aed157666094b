"""``delayed-retry parking replay|purge|refresh``: moving parked messages, at least once.

A message leaves its place only after its copy is confirmed (replay, refresh) or the
operator confirmed (purge); a failing command moves nothing more. The engine is
:mod:`delayed_retry.parking.lot`; this module asks, shows progress and reports.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from typing import Any

from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.cli import common, output, parking_args
from delayed_retry.cli.chain import checked_topology
from delayed_retry.cli.command import Command
from delayed_retry.cli.connection import connect
from delayed_retry.cli.parking_ids import resolve_ids
from delayed_retry.cli.parking_read import exception_text
from delayed_retry.parking.lot import (
    CanaryNews,
    MoveProgress,
    MoveReport,
    purge_matching,
    replay_matching,
)
from delayed_retry.parking.moving.report import CANARY_PARKED_AFTER_THE_REST, CANARY_PARKED_AGAIN
from delayed_retry.parking.refresh import refresh_needed, refresh_parked
from delayed_retry.rabbitmq.versions import broker_version

__all__ = ["PURGE", "REFRESH", "REPLAY", "who"]


def _replay_options(parser: argparse.ArgumentParser) -> None:
    parking_args.add_queue_args(parser)
    parking_args.add_filter_args(parser)
    parser.add_argument("--to", dest="to_queue", help="send to this queue instead of QUEUE")
    parser.add_argument(
        "--limit", type=output.count_type(0), help="replay at most this many (default: all)"
    )
    parser.add_argument("--rate", type=output.rate_type, help="at most this many, e.g. 50/s")
    parser.add_argument(
        "--delay", type=output.duration_type, default=0.0, help="come due after, e.g. 90s, 1h (now)"
    )
    parser.add_argument(
        "--canary",
        type=output.count_type(0),
        default=0,
        metavar="N",
        help="replay N first; stop if one parks again",
    )
    parser.add_argument(
        "--canary-wait",
        type=output.duration_type,
        default=None,
        metavar="DURATION",
        help="how long canaries have to park again once due before the rest follows (default: "
        "from their parking records, twice the retry span plus 5s; shorter ones are warned "
        "about)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would move; move nothing"
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="do not ask for confirmation (asked when an --id selects more than one message, "
        "and before replaying every parked message when no --id or filter is given)",
    )
    output.add_json_option(parser)
    common.add_topology_args(parser)


def _purge_options(parser: argparse.ArgumentParser) -> None:
    parking_args.add_queue_args(parser)
    parking_args.add_filter_args(parser)
    parser.add_argument("--all", action="store_true", help="select every parked message")
    parser.add_argument("--limit", type=output.count_type(0), help="purge at most this many")
    parser.add_argument("--rate", type=output.rate_type, help="at most this many, e.g. 500/s")
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would go; delete nothing"
    )
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    output.add_json_option(parser)
    common.add_topology_args(parser)


def _refresh_options(parser: argparse.ArgumentParser) -> None:
    parking_args.add_queue_args(parser)
    parser.add_argument(
        "--older-than",
        type=output.duration_type,
        metavar="AGE",
        help="only messages in the parking queue longer than AGE, e.g. 7d (default: all)",
    )
    parser.add_argument("--limit", type=int, help="refresh at most this many")
    parser.add_argument("--rate", type=output.rate_type, help="at most this many, e.g. 500/s")
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would move; move nothing"
    )
    output.add_json_option(parser)
    common.add_topology_args(parser)


def who() -> str | None:
    """Who runs the command, as ``user@host`` (``None`` when the system cannot say): what the
    parking commands record as ``replayed_by`` and ``edited_by``."""
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):
        return None


_DONE = {"replay": "replayed", "purge": "purged", "refresh": "refreshed"}
"""Each move in the past tense, as its progress and report say it."""


def _progress(args: argparse.Namespace, action: str) -> Any:
    """The progress bar of a move: messages looked at of the queue's depth, and acted on."""
    enabled = None if not args.json else False
    return output.progress_bar(
        action, total=None, enabled=enabled, counts="looked at", acted=_DONE[action]
    )


def _declined(question: str, args: argparse.Namespace, *, action: str) -> bool:
    """Whether the operator answered no to ``question`` (``--yes`` answers yes); if so, says on
    stderr that nothing moved."""
    if output.confirm(question, assume_yes=args.yes):
        return False
    print(f"nothing {_DONE[action]}", file=sys.stderr)
    return True


def _reporter(args: argparse.Namespace, update: Any) -> Any:
    def progress(step: MoveProgress) -> None:
        update(step.scanned, step.depth, acted=step.done)
        if step.dry_run and step.record is not None and not args.json:
            r = step.record
            print(f"would {step.action} {r.id}  {r.reason}  {exception_text(r)}")

    return progress


def _report(report: MoveReport, args: argparse.Namespace) -> int:
    if args.json:
        output.emit_json(report)
    verb = _DONE[report.action]
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
        raise output.CommandError(
            f"a canary parked again ({', '.join(report.canary_ids)}): the replay stopped after "
            f"{report.done}; the rest stay parked. Fix the cause, then replay again"
        )
    if report.canary_verdict == CANARY_PARKED_AFTER_THE_REST:
        rest = report.done - len(report.canary_ids)
        raise output.CommandError(
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
    where = parking_args.filter_from_args(args)
    limit = args.limit
    connection = await connect(args.url)
    async with connection:
        topology = await checked_topology(connection, args, queue=args.to_queue or args.queue)
        lot = parking_args.lot_from_args(args, topology)
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
            if ambiguous and not args.dry_run and _declined(question, args, action="replay"):
                return 1
        elif where.is_empty and not args.dry_run:
            # The whole lot, unfiltered: asked like a purge, with the count it is.
            preview = await replay_matching(
                channel, to_queue=args.to_queue, where=where, limit=limit, dry_run=True, **lot
            )
            if preview.done == 0:
                print(f"no parked messages of {args.queue!r}; nothing replayed")
                return 0
            limit = preview.done
            question = (
                f"replay all {limit} parked message(s) of {args.queue!r} (no --id or filter "
                "selects fewer)?"
            )
            if _declined(question, args, action="replay"):
                return 1
        with _progress(args, "replay") as bar:
            report = await replay_matching(
                channel,
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
                replayed_by=who(),
                **lot,
            )
    return _report(report, args)


async def _purge(args: argparse.Namespace) -> int:
    where = parking_args.filter_from_args(args)
    if where.is_empty and not args.all:
        raise output.UsageError(
            "parking purge needs a selection: --id, a filter (--exception, --reason, "
            "--older-than, ...) or --all"
        )
    topology = common.topology_from_args(args)
    connection = await connect(args.url)
    async with connection:
        channel = await connection.channel()
        selected: int | None = None
        if where.ids:
            where, selected, _ambiguous = await resolve_ids(
                channel, args, where, topology=topology, quiet=args.json
            )
            selected = selected if args.limit is None else min(selected, args.limit)
        lot = parking_args.lot_from_args(args, topology)
        if not args.dry_run:
            if selected is None:
                preview = await purge_matching(
                    channel, where=where, dry_run=True, limit=args.limit, **lot
                )
                selected = preview.done
            if selected == 0:
                print(f"no parked messages of {args.queue!r} match; nothing purged")
                return 0
            question = f"delete {selected} parked message(s) of {args.queue!r} for good?"
            if _declined(question, args, action="purge"):
                return 1
        with _progress(args, "purge") as bar:
            # The count the operator agreed to, never more (a message parked meanwhile stays).
            report = await purge_matching(
                channel,
                limit=args.limit if selected is None else selected,
                rate=args.rate,
                dry_run=args.dry_run,
                progress=_reporter(args, bar),
                where=where,
                **lot,
            )
    return _report(report, args)


async def _refresh(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise output.UsageError("--limit takes zero or more messages")
    topology = common.topology_from_args(args)
    connection = await connect(args.url)
    async with connection:
        channel = await connection.channel()
        underlay = await underlay_channel(channel)
        version = broker_version(getattr(underlay.connection, "server_properties", None))
        if not refresh_needed(version):
            assert version is not None
            print(
                f"note: RabbitMQ {version[0]}.{version[1]} truncates a quorum queue's log past "
                "long-held messages itself; refreshing frees no disk there",
                file=sys.stderr,
            )
        with _progress(args, "refresh") as bar:
            report = await refresh_parked(
                channel,
                older_than=args.older_than,
                limit=args.limit,
                rate=args.rate,
                dry_run=args.dry_run,
                progress=_reporter(args, bar),
                **parking_args.lot_from_args(args, topology),
            )
    return _report(report, args)


REPLAY = Command(
    name="replay",
    help="send parked messages back with a fresh retry budget",
    description="Move parked messages of QUEUE back to QUEUE (or --to) through the delay "
    "chain, with a fresh retry budget. Each leaves the parking queue only after the broker "
    "confirmed its copy. Without --id or a filter, every parked message is replayed, "
    "after a confirmation (--yes without a terminal).",
    options=_replay_options,
    run=_replay,
)

PURGE = Command(
    name="purge",
    help="delete parked messages for good (asks first)",
    description="Delete the selected parked messages. Asks for confirmation unless --yes. "
    "Archive them first ('delayed-retry archive') if anyone may ask for them.",
    options=_purge_options,
    run=_purge,
)

REFRESH = Command(
    name="refresh",
    help="move long-parked messages to the tail of their parking queue (disk, RabbitMQ < 4.3)",
    description="Move the parked messages of QUEUE that have been in its parking queue "
    "longer than --older-than (since parked, or since their last refresh) to the tail of "
    "the same queue: each original is acked only after the broker confirmed its copy. "
    "Before RabbitMQ 4.3 a quorum queue's log is truncated only up to its oldest "
    "message, so one message parked weeks ago keeps on disk everything parked and "
    "replayed since; once it is refreshed the broker can truncate the log. Records, "
    "ids and bodies do not change; nothing leaves the parking lot.",
    options=_refresh_options,
    run=_refresh,
)
