"""``delayed-retry migrate-plugin``: move an exchange off the delayed-message plugin."""

from __future__ import annotations

import argparse

import aio_pika

from delayed_retry.admin.plugin_migration import manual_steps, plan, prepare, read_exchange, swap
from delayed_retry.cli import common
from delayed_retry.cli.command import Command

__all__ = ["COMMAND"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exchange", required=True, help="the plugin exchange (x-delayed-message)")
    common.add_management_option(parser, purpose="reading EXCHANGE and its bindings")
    parser.add_argument(
        "--swap",
        action="store_true",
        help="second stage, once the plugin holds no delayed message: replace EXCHANGE",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")
    common.add_topology_args(parser)


async def _migrate(args: argparse.Namespace) -> int:
    definition = await read_exchange(common.management_client(args), exchange=args.exchange)
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
                await prepare(connection, definition, topology=common.topology_from_args(args))
        print("done")
    print("steps for people, in order:")
    for n, line in enumerate(manual_steps(definition), 1):
        print(f"  {n}. {line}")
    return 0


COMMAND = Command(
    name="migrate-plugin",
    help="move a delayed-message plugin exchange onto the front door",
    description="Read the plugin exchange EXCHANGE and its bindings through the management "
    "HTTP API, declare EXCHANGE.delay beside it (or, with --swap, replace EXCHANGE by an "
    "ordinary exchange with the same bindings), and print the steps left to people.",
    options=_options,
    run=_migrate,
)
