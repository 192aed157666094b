"""``delayed-retry migrate-plugin``: move an exchange off the delayed-message plugin."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika

from delayed_retry.admin.plugin_migration import manual_steps, plan, prepare, read_exchange, swap
from delayed_retry.cli.common import add_topology_args, topology_from_args
from delayed_retry.cli.main import run

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``migrate-plugin`` command."""
    cmd = sub.add_parser(
        "migrate-plugin",
        help="move a delayed-message plugin exchange onto the front door",
        description="Read the plugin exchange EXCHANGE and its bindings through the management "
        "HTTP API, declare EXCHANGE.delay beside it (or, with --swap, replace EXCHANGE by an "
        "ordinary exchange with the same bindings), and print the steps left to people.",
    )
    cmd.add_argument("--exchange", required=True, help="the plugin exchange (x-delayed-message)")
    cmd.add_argument(
        "--management-url",
        default=os.environ.get("RABBITMQ_MANAGEMENT_URL"),
        help="management API, e.g. http://guest:guest@127.0.0.1:15672 "
        "(default: $RABBITMQ_MANAGEMENT_URL, else --url's host and credentials on port 15672)",
    )
    cmd.add_argument(
        "--swap",
        action="store_true",
        help="second stage, once the plugin holds no delayed message: replace EXCHANGE",
    )
    cmd.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")
    add_topology_args(cmd)
    cmd.set_defaults(func=lambda args: run(_migrate(args)))


def management_url_for(amqp_url: str) -> str:
    """The management API URL on the AMQP URL's host, with its credentials, port 15672."""
    parts = urlsplit(amqp_url)
    auth = f"{parts.username or 'guest'}:{parts.password or 'guest'}@"
    return f"http://{auth}{parts.hostname or '127.0.0.1'}:15672"


def vhost_of(amqp_url: str) -> str:
    """The vhost an AMQP URL names (``/`` when it names none)."""
    path = urlsplit(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


async def _migrate(args: argparse.Namespace) -> int:
    management = args.management_url or management_url_for(args.url)
    definition = await asyncio.to_thread(
        read_exchange, management, vhost=vhost_of(args.url), exchange=args.exchange
    )
    stage = "swap" if args.swap else "prepare"
    print(
        f"exchange {definition.name!r}: type {definition.type}, x-delayed-type "
        f"{definition.delayed_type}, {len(definition.outgoing)} binding(s) out, "
        f"{len(definition.incoming)} in, messages_delayed="
        f"{'unknown' if definition.messages_delayed is None else definition.messages_delayed}"
    )
    if not definition.is_plugin:
        print(f"note: its type is {definition.type!r}, not x-delayed-message (a stand-in?)")
    verb = "would" if args.dry_run else "will"
    print(f"{stage}: delayed-retry {verb}:")
    for line in plan(definition, stage=stage):
        print(f"  - {line}")
    if not args.dry_run:
        connection = await aio_pika.connect(args.url)
        async with connection:
            if args.swap:
                await swap(connection, definition)
            else:
                await prepare(connection, definition, topology=topology_from_args(args))
        print("done")
    print("steps for people, in order:")
    for n, line in enumerate(manual_steps(definition), 1):
        print(f"  {n}. {line}")
    return 0
