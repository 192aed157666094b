"""``delayed-retry declare``: declare the delay chain and bind queues to it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import aio_pika

from delayed_retry.admin.chain_probe import declared_with, queue_depth
from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.amqp.declarer import declare_topology, declarer_for
from delayed_retry.cli import common, output
from delayed_retry.cli.command import Command
from delayed_retry.cli.work_queue import check_work_queue
from delayed_retry.errors import NotFoundError, queue_not_found
from delayed_retry.rabbitmq.work_queues import (
    WORK_QUEUE_DELIVERY_LIMIT,
    dead_letter_target,
    work_queue_arguments,
)

__all__ = ["COMMAND"]


def _options(parser: argparse.ArgumentParser) -> None:
    common.add_topology_args(parser)
    parser.add_argument(
        "--bind", metavar="QUEUE", action="append", default=[], help="queue to bind (repeatable)"
    )
    parser.add_argument(
        "--create",
        action="store_true",
        help="create each --bind queue that does not exist: durable, of --queue-type; a quorum "
        "queue gets a delivery limit past which the broker moves a message to "
        "QUEUE.dead-letter (a message the client cannot decode would stall it otherwise)",
    )
    parser.add_argument(
        "--delivery-limit",
        type=output.count_type(1),
        default=WORK_QUEUE_DELIVERY_LIMIT,
        metavar="N",
        help="deliveries before a queue made by --create moves a message to QUEUE.dead-letter "
        f"(default {WORK_QUEUE_DELIVERY_LIMIT}); for a queue that exists, the limit it was "
        "declared with, when the management API cannot tell",
    )
    common.add_management_option(parser, purpose="checking each --bind queue's delivery limit")


async def _declare(args: argparse.Namespace) -> int:
    topology = common.topology_from_args(args)
    made: dict[str, str | None] = {}  # each queue made here, with its dead-letter queue
    dead_letters: dict[str, str] = {}
    connection = await aio_pika.connect(args.url)
    async with connection:
        for queue in args.bind:
            if await queue_depth(connection, queue) is not None:
                continue
            if not args.create:
                raise NotFoundError(queue_not_found(queue, so="it cannot be bound to the chain"))
            arguments: dict[str, Any] = {"x-queue-type": topology.queue_type}
            if topology.queue_type == "quorum":
                arguments = work_queue_arguments(queue, delivery_limit=args.delivery_limit)
            created = await connection.channel()
            await created.declare_queue(queue, durable=True, arguments=arguments)
            await created.close()
            limit = (
                f", delivery limit {args.delivery_limit}" if "x-delivery-limit" in arguments else ""
            )
            print(f"created queue {queue!r} ({topology.queue_type}{limit})")
            made[queue] = dead_letter_target(arguments)
        channel = await connection.channel()
        await declare_topology(channel, topology, queues=args.bind, repair=True)
        underlay = (await underlay_channel(channel)).connection
        warnings: list[str] = []
        notes: list[str] = []
        for queue in args.bind:
            target = made.get(queue)
            if queue not in made:
                # Existing: its arguments and policy tell (management API, best effort); over
                # AMQP alone, whether it has work_queue_arguments with --delivery-limit.
                check = await check_work_queue(args, connection, queue)
                target = check.dead_letter_queue
                wanted = work_queue_arguments(queue, delivery_limit=args.delivery_limit)
                if target is None and await declared_with(connection, queue, wanted):
                    target = dead_letter_target(wanted)
                if check.warning is not None:
                    warnings.append(check.warning)
                if check.unchecked is not None:
                    notes.append(check.unchecked)
            if target is not None:
                await declarer_for(underlay).queue(
                    underlay, topology.dead_letter_queue_spec(target)
                )
                dead_letters[queue] = target
    print(
        f"declared topology {topology.prefix!r}: {topology.levels} levels of "
        f"{topology.unit_ms} ms ({topology.queue_type}), max delay {topology.max_delay}"
    )
    for queue in args.bind:
        print(f"bound {queue!r} to {topology.delivery_exchange!r}")
        if queue in dead_letters:
            print(
                f"declared {dead_letters[queue]!r}, where the broker moves what {queue!r} "
                "cannot deliver"
            )
    for warning in warnings:
        print(f"delayed-retry: warning: {warning}", file=sys.stderr, flush=True)
    for note in notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    return 0


COMMAND = Command(
    name="declare",
    help="declare the delay chain (and bind queues to it)",
    description="Declare the delay chain, delivery, unroutable and parking exchanges and "
    "queues, every binding included (so it puts back one removed by hand, which services "
    "that find the chain marked complete do not redeclare). Idempotent; fails naming any "
    "object that exists with other arguments.",
    options=_options,
    run=_declare,
)
