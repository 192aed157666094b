"""``delayed-retry parking list|show``: reading a parking lot, which never removes anything.

``list`` shows the failure groups and a page of records; ``show`` one parked message in
full (record, traceback, headers, body).
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

from delayed_retry.cli import common, output, parking_args
from delayed_retry.cli.command import Command
from delayed_retry.cli.connection import connect
from delayed_retry.cli.parking_ids import ambiguous_id, match_ids, no_such_id, resolve_ids
from delayed_retry.durations import format_duration, utcnow
from delayed_retry.headers.names import (
    BROKER_READ_COUNTERS,
    X_EXCEPTION_TRACEBACK,
    split_read_counters,
)
from delayed_retry.parking.lot import (
    ALL_PARKED,
    ParkedRecord,
    browse_parked,
    group_parked,
)

__all__ = ["exception_text", "LIST", "SHOW"]


def _list_options(parser: argparse.ArgumentParser) -> None:
    parking_args.add_queue_args(parser)
    parking_args.add_filter_args(parser)
    parser.add_argument(
        "--limit", type=output.count_type(1), default=20, help="records to show (%(default)s)"
    )
    parser.add_argument(
        "--offset", type=output.count_type(0), default=0, help="skip this many records first"
    )
    output.add_json_option(parser)
    common.add_topology_args(parser)


def _show_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="the record id 'parking list' shows, or its start")
    parser.add_argument(
        "--all",
        action="store_true",
        help="show every parked message the id selects (without it, more than one is an error)",
    )
    parking_args.add_queue_args(parser)
    output.add_json_option(parser)
    common.add_topology_args(parser)


def _age(record: ParkedRecord) -> str:
    age = record.age(now=utcnow())
    return "?" if age is None else format_duration(max(age, timedelta(0)))


def exception_text(record: ParkedRecord) -> str:
    """The record's exception on one line: short type name and message, or ``-``."""
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
    data = output.to_jsonable(record)
    headers, counters = split_read_counters(record.headers)
    data["headers"] = output.to_jsonable(headers)
    # The broker raises these on every read, this one included: not the message's own.
    data["broker_read_counters"] = output.to_jsonable(counters)
    data["body"] = output.to_jsonable(record.body)
    data["age_seconds"] = (
        None if record.parked_at is None else (utcnow() - record.parked_at).total_seconds()
    )
    return dict(data)


async def _list(args: argparse.Namespace) -> int:
    where = parking_args.filter_from_args(args)
    topology = common.topology_from_args(args)
    connection = await connect(args.url)
    async with connection:
        channel = await connection.channel()
        if where.ids:
            where, _count, _ambiguous = await resolve_ids(
                channel, args, where, topology=topology, quiet=args.json
            )
        lot = parking_args.lot_from_args(args, topology)
        groups = await group_parked(channel, where=where, **lot)
        page = await browse_parked(
            channel, where=where, offset=args.offset, limit=args.limit, **lot
        )
    if args.json:
        output.emit_json(
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
    total = output.counted(sum(g.count for g in groups), "message")
    print(f"failure groups of {args.queue!r} ({total}):")
    output.print_table(
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
    table = output.print_table(
        ("id", "age", "reason", "attempts", "exception", "body"),
        [
            (r.id, _age(r), r.reason, r.attempts, exception_text(r), _preview(r))
            for r in page.records
        ],
        right=(3,),
    )
    if any(r.id not in table for r in page.records):
        print(
            "ids are cut to fit the terminal (…): a unique start of an id is enough, as in "
            f"'delayed-retry parking show --queue {args.queue} ID-START'; --json prints them whole"
        )
    more = f"; next page: --offset {page.next_offset}" if page.next_offset is not None else ""
    print(f"{len(page.records)} shown from offset {page.offset}{more}; nothing was removed")
    return 0


SHOW_AT_MOST = 20
"""Messages ``parking show --all`` prints at most; give more of the id for the rest."""


async def _show(args: argparse.Namespace) -> int:
    topology = common.topology_from_args(args)
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
        output.emit_json(_summary(records[0]) if not args.all else [_summary(r) for r in records])
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
            print(f"    {key} = {output.to_jsonable(value)!r}")
    if counters:
        print(f"{'read counts':>14}: written by RabbitMQ on every read, this one included")
        for key, value in counters.items():
            print(f"    {key} = {output.to_jsonable(value)!r}  ({BROKER_READ_COUNTERS[key]})")
    if record.traceback:
        print("     traceback:")
        print("    " + record.traceback.rstrip().replace("\n", "\n    "))
    body = output.to_jsonable(record.body)
    print(f"          body ({len(record.body)} bytes):")
    if isinstance(body, str):
        print(body)
    else:
        print(f"(binary, base64) {body['base64']}")


LIST = Command(
    name="list",
    help="failure groups and parked messages, left in place",
    description="Show the failure groups of a queue's parked messages and a page of their "
    "records (reason, exception, attempts, age). Nothing is removed.",
    options=_list_options,
    run=_list,
)

SHOW = Command(
    name="show",
    help="one parked message in full: record, headers, body",
    description="Show one parked message: its failure record, traceback, headers and body "
    "(binary bodies as base64). ID may be the start of a record id; when it selects more "
    "than one message (two can share an id), they are listed, and --all shows each. "
    "Nothing is removed.",
    options=_show_options,
    run=_show,
)
