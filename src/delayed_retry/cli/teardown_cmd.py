"""``delayed-retry teardown``: remove a chain's queues and exchanges when they are empty."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import aio_pika

from delayed_retry.admin.chain_diff import topology_options
from delayed_retry.admin.teardown import TeardownPlan, plan_teardown, tear_down
from delayed_retry.cli.common import add_topology_args, topology_from_args
from delayed_retry.cli.main import run
from delayed_retry.cli.output import CommandError, add_json_option, confirm, emit_json

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``teardown`` command."""
    teardown = sub.add_parser(
        "teardown",
        help="remove a chain's queues and exchanges when they are empty",
        description="Delete the level, unroutable, rejected and alerts queues and every "
        "exchange of the chain the topology options describe (and QUEUE.parking for each "
        "--queue), only when none holds a message: otherwise nothing is deleted and the "
        "non-empty queues are named. Asks for confirmation unless --yes. Exit status: 0 "
        "removed (or nothing to remove), 1 refused or not confirmed, 2 usage or connection error.",
    )
    add_topology_args(teardown)
    teardown.add_argument(
        "--queue",
        metavar="QUEUE",
        action="append",
        default=[],
        help="also remove QUEUE.parking (repeatable; QUEUE itself is never removed)",
    )
    teardown.add_argument("--dry-run", action="store_true", help="list what would be removed")
    teardown.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_json_option(teardown)
    teardown.set_defaults(func=lambda args: run(_teardown(args)))


def _print_plan(plan: TeardownPlan, prefix: str) -> None:
    for name, count in plan.not_empty.items():
        print(f"✗ queue {name!r} holds {count} message(s)")
    if plan.queues or plan.exchanges:
        print(
            f"chain {prefix!r}: {len(plan.queues)} empty queue(s) and {len(plan.exchanges)} "
            "exchange(s) to remove:"
        )
        for name in plan.queues:
            print(f"  queue    {name}")
        for name in plan.exchanges:
            print(f"  exchange {name}")
    if plan.missing:
        print(f"{len(plan.missing)} object(s) already absent")


async def _teardown(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    connection = await aio_pika.connect(args.url)
    async with connection:
        plan = await plan_teardown(connection, topology, queues=args.queue)
        if args.json:
            emit_json(
                {
                    "dry_run": args.dry_run,
                    "queues": plan.queues,
                    "exchanges": plan.exchanges,
                    "not_empty": plan.not_empty,
                    "missing": plan.missing,
                }
            )
        else:
            _print_plan(plan, topology.prefix)
        if plan.blocked:
            raise CommandError(
                f"chain {topology.prefix!r} is not empty ({', '.join(plan.not_empty)}); "
                "nothing removed. Move its messages first (delayed-retry topology migrate, or "
                "wait for them to be delivered; purge the alerts queue if its copies are no "
                "longer needed)"
            )
        note = sys.stderr if args.json else sys.stdout
        if not plan.queues and not plan.exchanges:
            print(f"nothing to remove: chain {topology.prefix!r} does not exist", file=note)
            return 0
        if args.dry_run:
            print("dry run: nothing removed", file=note)
            return 0
        question = (
            f"remove {len(plan.queues)} queue(s) and {len(plan.exchanges)} exchange(s) of "
            f"chain {topology.prefix!r}?"
        )
        if not confirm(question, assume_yes=args.yes):
            raise CommandError("not confirmed; nothing removed")
        refused = await tear_down(connection, plan)
    if refused:
        raise CommandError(
            f"{', '.join(refused)} received messages meanwhile and were kept, with every "
            "exchange of the chain, but the other queues are gone: run "
            f"'delayed-retry declare {topology_options(topology)}' to restore the chain for "
            "them, or teardown again once they are empty"
        )
    print(
        f"removed chain {topology.prefix!r}: {len(plan.queues)} queue(s), "
        f"{len(plan.exchanges)} exchange(s)"
    )
    return 0
