"""``delayed-retry front-door``: the delayed-message plugin's ``x-delay`` contract, until stopped.

It runs until SIGINT or SIGTERM; messages it holds unacked go back to their
queue when it stops or dies, so a restart (or another instance) picks them up.
"""

from __future__ import annotations

import argparse
from typing import Any

import aio_pika

from delayed_retry.cli.common import add_topology_args, topology_from_args, until_stopped
from delayed_retry.cli.main import run
from delayed_retry.cli.startup import Startup, announce
from delayed_retry.delivery.front_door import FrontDoor

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``front-door`` command."""
    door = sub.add_parser(
        "front-door",
        help="the delayed-message plugin's x-delay contract: X.delay -> delay -> X",
        description="Messages published to EXCHANGE.delay with header x-delay (ms) are "
        "delivered to EXCHANGE with their routing key after the delay. Several may run at once.",
    )
    door.add_argument("--exchange", required=True, help="the exchange consumers are bound to")
    door.add_argument(
        "--exchange-type",
        choices=("direct", "topic", "fanout", "headers"),
        default="topic",
        help="type of EXCHANGE, the plugin exchange's x-delayed-type (%(default)s)",
    )
    door.add_argument("--prefetch", type=int, default=1000, help="unacked at once (%(default)s)")
    add_topology_args(door)
    door.set_defaults(func=lambda args: run(_front_door(args)))


async def _front_door(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    connection = await aio_pika.connect_robust(args.url)
    async with connection:
        door = FrontDoor(
            connection,
            exchange=args.exchange,
            exchange_type=args.exchange_type,
            topology=topology,
            prefetch=args.prefetch,
        )
        startup = Startup(
            command="front-door",
            topology=topology,
            consumes=(door.inbox_queue, door.forward_queue),
            delivers_to=(args.exchange,),
        )
        await announce(args, connection, startup)
        async with door:
            await until_stopped()
        print(
            f"accepted {door.accepted}, forwarded {door.forwarder.forwarded}, parked "
            f"{door.forwarder.parked}, given back {door.given_back + door.forwarder.given_back}"
        )
    return 0
