"""``delayed-retry parking list|replay``: the on-call engineer's view of parked messages."""

from __future__ import annotations

import argparse
from typing import Any

import aio_pika

from delayed_retry.cli.common import add_topology_args, topology_from_args
from delayed_retry.cli.main import run
from delayed_retry.parking import peek_parked, replay_parked

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the parking commands."""
    parking = sub.add_parser("parking", help="look at and replay parked messages")
    commands = parking.add_subparsers(dest="parking_command", required=True, metavar="ACTION")

    listing = commands.add_parser(
        "list",
        help="show parked messages of a queue without removing them",
        description="Show the failure record of parked messages, leaving them in place.",
    )
    listing.add_argument("--queue", required=True, help="the queue whose parked messages to show")
    listing.add_argument("--parking-queue", help="parking queue name if not QUEUE.parking")
    listing.add_argument("--limit", type=int, default=20, help="at most this many (%(default)s)")
    add_topology_args(listing)
    listing.set_defaults(func=lambda args: run(_list(args)))

    replay = commands.add_parser(
        "replay",
        help="send parked messages back to their queue with a fresh retry budget",
        description="Move parked messages of QUEUE back to QUEUE (or --to) through the delay "
        "chain. Each is acked in the parking queue only after the broker confirmed the copy.",
    )
    replay.add_argument("--queue", required=True, help="the queue whose parked messages to replay")
    replay.add_argument("--parking-queue", help="parking queue name if not QUEUE.parking")
    replay.add_argument("--to", dest="to_queue", help="send to this queue instead of QUEUE")
    replay.add_argument("--limit", type=int, help="replay at most this many (default: all)")
    replay.add_argument("--delay", type=float, default=0.0, help="seconds before they come due")
    add_topology_args(replay)
    replay.set_defaults(func=lambda args: run(_replay(args)))


async def _list(args: argparse.Namespace) -> int:
    connection = await aio_pika.connect(args.url)
    async with connection:
        channel = await connection.channel()
        parked = await peek_parked(
            channel,
            queue=args.queue,
            parking_queue=args.parking_queue,
            limit=args.limit,
            topology=topology_from_args(args),
        )
    if not parked:
        print(f"no parked messages for {args.queue!r}")
        return 0
    for p in parked:
        when = p.parked_at.isoformat(timespec="seconds") if p.parked_at else "?"
        error = f"{p.exception_type}: {p.exception_message}" if p.exception_type else "-"
        print(f"{when}  {p.message_id or '-'}  {p.reason}  attempts={p.attempts}  {error}")
        print(f"    from exchange={p.original_exchange!r} key={p.original_routing_key!r}")
        print(f"    body: {p.body_preview[:120]}")
    print(f"{len(parked)} shown (at most --limit {args.limit}); nothing was removed")
    return 0


async def _replay(args: argparse.Namespace) -> int:
    connection = await aio_pika.connect(args.url)
    async with connection:
        channel = await connection.channel()
        result = await replay_parked(
            channel,
            queue=args.queue,
            parking_queue=args.parking_queue,
            to_queue=args.to_queue,
            limit=args.limit,
            delay=args.delay,
            topology=topology_from_args(args),
        )
    print(f"replayed {result.replayed} message(s) to {result.to_queue!r}")
    return 0
