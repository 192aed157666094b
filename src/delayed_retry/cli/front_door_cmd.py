"""``delayed-retry front-door``: the delayed-message plugin's ``x-delay`` contract, until stopped.

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
from delayed_retry.delivery.front_door import FrontDoor

__all__ = ["COMMAND"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exchange", required=True, help="the exchange consumers are bound to")
    parser.add_argument(
        "--exchange-type",
        choices=("direct", "topic", "fanout", "headers"),
        default="topic",
        help="type of EXCHANGE, the plugin exchange's x-delayed-type (%(default)s)",
    )
    add_forwarding_args(parser)


async def _front_door(args: argparse.Namespace) -> int:
    topology = common.topology_from_args(args)

    async def start(connection: AbstractRobustConnection | None) -> Running:
        assert connection is not None
        door = FrontDoor(
            connection,
            exchange=args.exchange,
            exchange_type=args.exchange_type,
            topology=topology,
            prefetch=args.prefetch,
        )
        await door.start()
        forwarder = door.forwarder
        return forwarding(
            door,
            startup=Startup(
                command="front-door",
                topology=topology,
                consumes=(door.inbox_queue, door.forward_queue),
                delivers_to=(args.exchange,),
            ),
            counts=lambda: {
                "accepted": door.accepted,
                "forwarded": forwarder.forwarded,
                "parked": forwarder.parked,
                "given_back": door.given_back + forwarder.given_back,
            },
        )

    return await run_service(args, command="front-door", start=start)


COMMAND = Command(
    name="front-door",
    help="the delayed-message plugin's x-delay contract: X.delay -> delay -> X",
    description="Messages published to EXCHANGE.delay with header x-delay (ms) are "
    "delivered to EXCHANGE with their routing key after the delay. Several may run at once.",
    options=_options,
    run=_front_door,
)
