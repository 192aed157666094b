"""``delayed-retry declare``: declare the delay chain and bind queues to it."""

from __future__ import annotations

import argparse
from typing import Any

import aio_pika

from delayed_retry.admin.chain_probe import queue_depth
from delayed_retry.amqp.declare import declare_topology
from delayed_retry.cli.common import add_topology_args, topology_from_args
from delayed_retry.cli.main import run
from delayed_retry.errors import NotFoundError, queue_not_found

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``declare`` command."""
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
    declare.add_argument(
        "--create",
        action="store_true",
        help="create each --bind queue that does not exist (durable, of --queue-type)",
    )
    declare.set_defaults(func=lambda args: run(_declare(args)))


async def _declare(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    connection = await aio_pika.connect(args.url)
    async with connection:
        for queue in args.bind:
            if await queue_depth(connection, queue) is not None:
                continue
            if not args.create:
                raise NotFoundError(queue_not_found(queue, so="it cannot be bound to the chain"))
            created = await connection.channel()
            await created.declare_queue(
                queue, durable=True, arguments={"x-queue-type": topology.queue_type}
            )
            await created.close()
            print(f"created queue {queue!r} ({topology.queue_type})")
        channel = await connection.channel()
        await declare_topology(channel, topology, queues=args.bind)
    print(
        f"declared topology {topology.prefix!r}: {topology.levels} levels of "
        f"{topology.unit_ms} ms ({topology.queue_type}), max delay {topology.max_delay}"
    )
    for queue in args.bind:
        print(f"bound {queue!r} to {topology.delivery_exchange!r}")
    return 0
