"""``delayed-retry forwarder`` and ``delayed-retry front-door``: long-running delivery processes.

Both run until SIGINT or SIGTERM; messages they hold unacked go back to their
queue when they stop or die, so a restart (or another instance) picks them up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

import aio_pika

from delayed_retry.cli.common import add_topology_args, topology_from_args
from delayed_retry.cli.main import run
from delayed_retry.delivery.forwarder import Forwarder
from delayed_retry.delivery.front_door import FrontDoor

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``forwarder`` and ``front-door`` commands."""
    fwd = sub.add_parser(
        "forwarder",
        help="deliver delays addressed to exchanges (publish_delayed(exchange=...))",
        description="Consume the forward queue of each EXCHANGE and publish its messages to "
        "EXCHANGE with their routing key: confirm, then ack. Several may run at once.",
    )
    fwd.add_argument(
        "--exchange", action="append", required=True, help="an exchange to forward to (repeat)"
    )
    fwd.add_argument("--prefetch", type=int, default=100, help="unacked at once (%(default)s)")
    add_topology_args(fwd)
    fwd.set_defaults(func=lambda args: run(_forwarder(args)))

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
    door.add_argument("--prefetch", type=int, default=100, help="unacked at once (%(default)s)")
    add_topology_args(door)
    door.set_defaults(func=lambda args: run(_front_door(args)))


async def _until_stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    print("running; stop with Ctrl-C or SIGTERM", flush=True)
    await stop.wait()


async def _forwarder(args: argparse.Namespace) -> int:
    connection = await aio_pika.connect_robust(args.url)
    async with connection:
        forwarder = Forwarder(
            connection,
            exchanges=args.exchange,
            topology=topology_from_args(args),
            prefetch=args.prefetch,
        )
        async with forwarder:
            await _until_stopped()
        print(f"forwarded {forwarder.forwarded}, parked {forwarder.parked}")
    return 0


async def _front_door(args: argparse.Namespace) -> int:
    connection = await aio_pika.connect_robust(args.url)
    async with connection:
        door = FrontDoor(
            connection,
            exchange=args.exchange,
            exchange_type=args.exchange_type,
            topology=topology_from_args(args),
            prefetch=args.prefetch,
        )
        async with door:
            await _until_stopped()
        print(f"accepted {door.accepted}, forwarded {door.forwarder.forwarded}")
    return 0
