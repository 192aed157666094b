"""``delayed-retry topology discard|expedite``: take chosen waiting messages out of the chain.

``discard`` deletes or parks them, ``expedite`` delivers them now ("retry now"). The
library behind them is :mod:`delayed_retry.admin.chain_discard`; this module asks, lists
and reports, the way ``parking purge`` does.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from delayed_retry.admin.chain_discard import DiscardReport, discard_waiting, expedite_waiting
from delayed_retry.admin.waiting import WaitingMessage
from delayed_retry.cli import common, output
from delayed_retry.cli.chain import checked_topology
from delayed_retry.cli.command import Command
from delayed_retry.cli.connection import connect

__all__ = ["DISCARD", "EXPEDITE"]


def _discard_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--park",
        action="store_true",
        help="move them to QUEUE.parking with reason 'discarded' instead of deleting them",
    )
    _add_selection_args(parser)


def _add_selection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--id",
        dest="ids",
        action="append",
        default=[],
        metavar="ID",
        help="a waiting message's whole id: its message id, or sha256:... as --dry-run lists "
        "it (repeatable; every waiting message with that id is taken)",
    )
    parser.add_argument(
        "--queue",
        metavar="QUEUE",
        help="only messages due to QUEUE; alone, every message waiting for QUEUE",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would go; take nothing")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    output.add_json_option(parser)
    common.add_topology_args(parser)


def _what(args: argparse.Namespace) -> str:
    parts = []
    if args.ids:
        parts.append("with id " + ", ".join(repr(i) for i in args.ids))
    if args.queue:
        parts.append(f"due to {args.queue!r}")
    return " ".join(parts)


def _question(args: argparse.Namespace, count: int) -> str:
    if args.expedite:
        return f"deliver {count} waiting message(s) {_what(args)} now?"
    verb, where = ("park", " (to their parking queue)") if args.park else ("delete", " for good")
    return f"{verb} {count} waiting message(s) {_what(args)}{where}?"


async def _take(args: argparse.Namespace) -> int:
    verb, done = ("expedite", "delivered") if args.expedite else ("discard", "discarded")
    if not args.ids and not args.queue:
        raise output.UsageError(
            f"topology {verb} needs a selection: --id (as 'topology {verb} --dry-run --queue "
            "QUEUE' lists them), --queue, or both"
            + ("" if args.expedite else "; 'teardown --discard-waiting' removes everything")
        )
    connection = await connect(args.url)
    async with connection:
        topology = await checked_topology(connection, args, queue=args.queue)
        channel = await connection.channel()
        selection: dict[str, Any] = dict(ids=tuple(args.ids), queue=args.queue, topology=topology)
        if args.expedite:
            take: Any = expedite_waiting
        else:
            take, selection["park"] = discard_waiting, args.park
        limit: int | None = None
        if not args.dry_run and not args.yes:
            preview = await take(channel, dry_run=True, **selection)
            _refuse_unmatched(preview, args, prefix=topology.prefix)
            if preview.done == 0:
                print(f"no message {_what(args)} waits in the chain; nothing {done}")
                return 0
            if not output.confirm(_question(args, preview.done), assume_yes=False):
                print(f"nothing {done}", file=sys.stderr)
                return 1
            limit = preview.done  # the count the operator agreed to, never more
        report = await take(channel, dry_run=args.dry_run, limit=limit, **selection)
    return _report(report, args, prefix=topology.prefix)


def _refuse_unmatched(report: DiscardReport, args: argparse.Namespace, *, prefix: str) -> None:
    if not report.unmatched:
        return
    missing = ", ".join(repr(i) for i in report.unmatched)
    where = f" due to {args.queue!r}" if args.queue else ""
    taken = "" if report.dry_run else f" ({report.done} other message(s) were taken out)"
    raise output.CommandError(
        f"no message{where} with id {missing} waits in the delay chain "
        f"{prefix!r}{taken}: it may have arrived already or never "
        "been scheduled; 'delayed-retry topology discard --dry-run --queue QUEUE' lists the "
        "ids waiting for a queue"
    )


def _row(message: WaitingMessage) -> tuple[object, ...]:
    due = "unknown" if message.due_at is None else f"{message.due_at:%Y-%m-%d %H:%M:%S} UTC"
    return (message.id, message.destination or "?", due, message.level)


def _report(report: DiscardReport, args: argparse.Namespace, *, prefix: str) -> int:
    if args.json:
        output.emit_json(report)
    else:
        if report.dry_run and report.selected:
            output.print_table(
                ("id", "destination", "due", "level"),
                [_row(m) for m in report.selected],
                right=(3,),
            )
        verb = {"park": "parked", "discard": "discarded", "expedite": "delivered"}[report.action]
        if report.dry_run:
            line = (
                f"dry run: would have {verb} {report.done} of {report.scanned} waiting message(s)"
            )
        else:
            line = f"{verb} {report.done} of {report.scanned} waiting message(s)"
            if report.parked_to or report.delivered_to:
                line += " to " + ", ".join(repr(q) for q in report.parked_to + report.delivered_to)
        print(f"{line}; the others were held {report.seconds:.3f} s and given back")
    _refuse_unmatched(report, args, prefix=prefix)
    return 0


DISCARD = Command(
    name="discard",
    help="take chosen waiting messages out of the chain (delete, or --park them)",
    description="Take the messages waiting in the delay chain that --id (and/or --queue) "
    "select out of it: retry copies and messages scheduled with 'publish --delay'. They "
    "are deleted, or with --park moved to their queue's parking queue with reason "
    "'discarded', from where 'parking replay' sends them back. The chain is read from "
    "its highest level down; the other messages are held meanwhile and given back at "
    "the end, never early and late by at most the scan's length. Asks for confirmation "
    "unless --yes. --dry-run lists the selected messages (id, destination, due time) and "
    "takes nothing. Exit status: 0 done, 1 an --id selected nothing, the chain is not "
    "there, or a waiting message was returned so often that RabbitMQ 4.x could move it "
    "on early (the scan stops there), 2 usage error.",
    options=_discard_options,
    run=_take,
    defaults={"expedite": False},
)

EXPEDITE = Command(
    name="expedite",
    help="deliver chosen waiting messages now ('retry now'), their retry count unchanged",
    description="Deliver the messages waiting in the delay chain that --id (and/or "
    "--queue) select to their queue now: a retry waiting hours once the bug is fixed, or "
    "a scheduled message wanted early. Each keeps its retry count and failure record and "
    "leaves the chain only once its copy is confirmed. The chain is read from its highest "
    "level down; the other messages are held meanwhile and given back at the end, never "
    "early and late by at most the scan's length. Asks for confirmation unless --yes. "
    "--dry-run lists the selected messages and takes nothing. Exit status: 0 done, 1 an "
    "--id selected nothing or the chain is not there, 2 usage error.",
    options=_add_selection_args,
    run=_take,
    defaults={"expedite": True, "park": False},
)
