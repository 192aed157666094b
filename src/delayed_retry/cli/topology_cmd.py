"""``delayed-retry declare`` and ``delayed-retry status``."""

from __future__ import annotations

import argparse
from typing import Any

import aio_pika
import aiormq

from delayed_retry.cli.common import add_topology_args, topology_from_args
from delayed_retry.cli.main import run
from delayed_retry.declare import declare_topology

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the topology commands."""
    declare = sub.add_parser(
        "declare",
        help="declare the delay chain (and bind queues to it)",
        description="Declare the delay chain, delivery, unroutable and parking exchanges and "
        "queues. Idempotent; fails naming any object that exists with other arguments.",
    )
    add_topology_args(declare)
    declare.add_argument(
        "--bind", metavar="QUEUE", action="append", default=[], help="queue to bind (repeatable)"
    )
    declare.set_defaults(func=lambda args: run(_declare(args)))

    status = sub.add_parser(
        "status",
        help="messages waiting in each level, unroutable, alerts and parking queues",
        description="Show how many messages wait in each part of the chain. Read-only.",
    )
    add_topology_args(status)
    status.add_argument(
        "--queue", metavar="QUEUE", action="append", default=[], help="also show QUEUE.parking"
    )
    status.set_defaults(func=lambda args: run(_status(args)))


async def _declare(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    connection = await aio_pika.connect(args.url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology, queues=args.bind)
    print(
        f"declared topology {topology.prefix!r}: {topology.levels} levels of "
        f"{topology.unit_ms} ms ({topology.queue_type}), max delay {topology.max_delay}"
    )
    for queue in args.bind:
        print(f"bound {queue!r} to {topology.delivery_exchange!r}")
    return 0


async def _count(connection: aio_pika.abc.AbstractConnection, name: str) -> int | None:
    channel = await connection.channel(publisher_confirms=False)
    try:
        queue = await channel.declare_queue(name, passive=True)
        result = queue.declaration_result
        return int(result.message_count) if result.message_count is not None else 0
    except aiormq.exceptions.ChannelNotFoundEntity:
        return None
    finally:
        if not channel.is_closed:
            await channel.close()


async def _status(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    rows: list[tuple[str, str, int | None]] = []
    connection = await aio_pika.connect(args.url)
    async with connection:
        for level in range(topology.levels):
            hold = f"{(1 << level) * topology.unit_ms} ms"
            rows.append(
                (
                    topology.level_name(level),
                    hold,
                    await _count(connection, topology.level_name(level)),
                )
            )
        rows.append(
            (
                topology.unroutable_queue,
                "unroutable",
                await _count(connection, topology.unroutable_queue),
            )
        )
        rows.append(
            (topology.alerts_queue, "alert copies", await _count(connection, topology.alerts_queue))
        )
        for queue in args.queue:
            name = topology.default_parking_queue(queue)
            rows.append((name, "parked", await _count(connection, name)))
    width = max(len(r[0]) for r in rows)
    print(f"{'queue':<{width}}  {'holds':>16}  messages")
    for name, what, count in rows:
        shown = "missing" if count is None else str(count)
        print(f"{name:<{width}}  {what:>16}  {shown}")
    missing = [name for name, _, count in rows if count is None]
    if missing:
        print(f"{len(missing)} queue(s) missing: run 'delayed-retry declare' with the same options")
        return 1
    return 0
