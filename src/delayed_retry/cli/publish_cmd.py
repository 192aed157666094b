"""``delayed-retry publish``: schedule one message from the shell, confirmed by the broker."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta

from delayed_retry.admin.chain_probe import queue_depth
from delayed_retry.cli import common, output
from delayed_retry.cli.chain import checked_topology
from delayed_retry.cli.command import Command
from delayed_retry.cli.connection import connect
from delayed_retry.durations import format_duration, utcnow
from delayed_retry.errors import NotFoundError, queue_not_found

__all__ = ["COMMAND"]


def _moment(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--at {text!r} is not a date and time; write it like 2026-12-01T09:00Z"
        ) from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"--at {text!r} has no timezone; add one, e.g. {text}Z for UTC or {text}+02:00"
        )
    return moment


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", required=True, help="the queue that receives it when due")
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay", type=output.duration_type, help="due after, e.g. 90s, 15m, 1h, 2d")
    when.add_argument("--at", type=_moment, help="due at, e.g. 2026-12-01T09:00Z")
    parser.add_argument("--body", default="", help="the body as text, or - to read stdin")
    output.add_header_option(parser, "--header", help="a header (repeatable)", metavar="NAME=VALUE")
    parser.add_argument("--message-id", help="message id (default: none)")
    parser.add_argument("--content-type", help="content type, e.g. application/json")
    output.add_json_option(parser)
    common.add_topology_args(parser)


async def _publish(args: argparse.Namespace) -> int:
    import aio_pika

    from delayed_retry.delivery.schedule import publish_delayed

    body = sys.stdin.buffer.read() if args.body == "-" else args.body.encode()
    now = utcnow()
    due_at = args.at if args.at is not None else now + timedelta(seconds=args.delay)
    connection = await connect(args.url)
    async with connection:
        if await queue_depth(connection, args.queue) is None:
            raise NotFoundError(queue_not_found(args.queue, so="nothing can be scheduled for it"))
        topology = await checked_topology(connection, args, queue=args.queue)
        if due_at - now > topology.max_delay:
            raise output.UsageError(
                f"due in {format_duration(due_at - now)}, longer than the chain's maximum "
                f"{format_duration(topology.max_delay)}; pick an earlier time"
            )
        channel = await connection.channel()
        message = aio_pika.Message(
            body,
            headers=dict(args.header),
            message_id=args.message_id,
            content_type=args.content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        await publish_delayed(channel, message, queue=args.queue, delay=due_at, topology=topology)
    if args.json:
        output.emit_json(
            {"queue": args.queue, "due_at": due_at, "bytes": len(body), "confirmed": True}
        )
    else:
        print(
            f"scheduled {len(body)} byte(s) for {args.queue!r}, due {due_at.isoformat()} "
            f"(in {format_duration(max(due_at - now, timedelta(0)))}); the broker confirmed it"
        )
    return 0


COMMAND = Command(
    name="publish",
    help="schedule one message for a queue after a delay or at a time",
    description="Publish one message through the delay chain to QUEUE, due after --delay "
    "or at --at. Returns once the broker confirmed it (exit 1 if it did not).",
    options=_options,
    run=_publish,
)
