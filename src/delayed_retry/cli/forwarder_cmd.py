"""``delayed-retry forwarder``: deliver delays addressed to exchanges, until stopped.

It runs until SIGINT or SIGTERM; messages it holds unacked go back to their
queue when it stops or dies, so a restart (or another instance) picks them up.
"""

from __future__ import annotations

import argparse

from aio_pika.abc import AbstractRobustConnection

from delayed_retry.cli import common
from delayed_retry.cli.command import Command
from delayed_retry.cli.service import add_forwarding_args, run_service
from delayed_retry.cli.service_state import Running, forwarding
from delayed_retry.cli.startup import Startup
from delayed_retry.delivery.forwarder import Forwarder

__all__ = ["COMMAND"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exchange", action="append", required=True, help="an exchange to forward to (repeat)"
    )
    add_forwarding_args(parser)


async def _forwarder(args: argparse.Namespace) -> int:
    topology = common.topology_from_args(args)

    async def start(connection: AbstractRobustConnection | None) -> Running:
        assert connection is not None
        forwarder = Forwarder(
            connection, exchanges=args.exchange, topology=topology, prefetch=args.prefetch
        )
        await forwarder.start()
        return forwarding(
            forwarder,
            startup=Startup(
                command="forwarder",
                topology=topology,
                consumes=tuple(topology.forward_queue(x) for x in args.exchange),
                delivers_to=tuple(args.exchange),
            ),
            counts=lambda: {
                "forwarded": forwarder.forwarded,
                "parked": forwarder.parked,
                "given_back": forwarder.given_back,
            },
        )

    return await run_service(args, command="forwarder", start=start)


COMMAND = Command(
    name="forwarder",
    help="deliver delays addressed to exchanges (publish_delayed(exchange=...))",
    description="Consume the forward queue of each EXCHANGE and publish its messages to "
    "EXCHANGE with their routing key: confirm, then ack. Several may run at once.",
    options=_options,
    run=_forwarder,
)
