"""``delayed-retry teardown``: remove a chain's queues and exchanges when they are empty."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import TextIO

from delayed_retry.admin.management import BEST_EFFORT_TIMEOUT
from delayed_retry.admin.teardown import (
    TeardownOutcome,
    TeardownPlan,
    deletion_order,
    found_forwarding,
    other_parking_queues,
    plan_teardown,
    tear_down,
)
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli import common, output
from delayed_retry.cli.command import Command
from delayed_retry.cli.connection import connect

__all__ = ["how_to_empty", "COMMAND"]


def _options(parser: argparse.ArgumentParser) -> None:
    common.add_topology_args(parser)
    common.add_queues_option(
        parser, help="also remove QUEUE.parking (repeatable; QUEUE itself is never removed)"
    )
    parser.add_argument(
        "--purge-alerts",
        action="store_true",
        help="remove the alert queue (PREFIX.parking.alerts) with the copies it holds (they "
        "are copies of parked and unroutable messages, which stay where they are) and the "
        "stream of muted failure groups (PREFIX.parking.mutes) with its mutes",
    )
    parser.add_argument(
        "--discard-waiting",
        action="store_true",
        help="remove the level queues with the messages still waiting in them, which are then "
        "never delivered (the confirmation names how many; --yes answers it)",
    )
    parser.add_argument(
        "--forward",
        metavar="EXCHANGE",
        action="append",
        default=[],
        help="also remove what a forwarder and a front door declared for EXCHANGE: the queue "
        "PREFIX.forward.EXCHANGE, the exchange and queue EXCHANGE.delay and their parking "
        "queues (repeatable; EXCHANGE itself is never removed)",
    )
    parser.add_argument(
        "--forwarding",
        action="store_true",
        help="--forward every exchange the chain forwards to (read from the management API; "
        "without this option they are listed and kept)",
    )
    common.add_management_option(parser, purpose="finding forward queues")
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    output.add_json_option(parser)


def how_to_empty(topology: DelayTopology, queue: str, work_queues: Iterable[str] = ()) -> str:
    """What empties ``queue`` of ``topology``'s chain (a step or a command), for a refusal."""
    options = common.topology_options(topology)
    purge = f"'delayed-retry parking purge --queue {queue} --parking-queue {queue} --all {options}'"
    if topology.is_level_queue(queue):
        source = (
            "--from nservicebus"
            if topology.naming == "nservicebus-v2"
            else f"--from delayed-retry --from-prefix {topology.prefix} "
            f"--from-levels {topology.levels} --from-unit-ms {topology.unit_ms}"
        )
        return (
            f"wait until they are delivered ('delayed-retry status {options}' says when), "
            f"move them to another chain ('delayed-retry topology migrate --prefix NEW "
            f"{source}'), or add --discard-waiting to remove them with the chain, never "
            "delivered"
        )
    if queue == topology.mutes_stream:
        return (
            "add --purge-alerts to remove the stream with the failure groups muted for the "
            "alerts ('delayed-retry mutes' lists them)"
        )
    if queue == topology.alerts_queue:
        return (
            "add --purge-alerts to remove the queue with these alert copies (the parked and "
            "unroutable messages they copy stay where they are), or let 'delayed-retry "
            "alerts' consume them"
        )
    if queue == topology.unroutable_queue:
        return (
            f"replay them ('delayed-retry parking replay --queue {queue} --parking-queue "
            f"{queue} --to QUEUE {options}') or delete them ({purge})"
        )
    if queue == topology.rejected_queue:
        return (
            f"let a router retry them ('delayed-retry router --queue QUEUE {options}') or "
            f"delete them ({purge})"
        )
    for work in work_queues:
        if queue == topology.default_parking_queue(work):
            return (
                f"replay them through another chain ('delayed-retry parking replay --queue "
                f"{work} --prefix NEW ...') or delete them ('delayed-retry parking purge "
                f"--queue {work} --all {options}'; archive them first if anyone may ask)"
            )
    return f"delete them ({purge})"


def _blockers(plan: TeardownPlan, topology: DelayTopology, work_queues: list[str]) -> list[str]:
    """One line per queue in the way: what it holds and how to empty it."""
    lines = [
        f"queue {name!r} holds {count} message(s): {how_to_empty(topology, name, work_queues)}"
        for name, count in plan.not_empty.items()
    ]
    lines += [
        f"queue {name!r} has {count} consumer(s): stop them first (a router, 'delayed-retry "
        "alerts', a replay or an application consuming it)"
        for name, count in plan.consumers.items()
    ]
    return lines


def _print_blockers(
    plan: TeardownPlan, topology: DelayTopology, work_queues: list[str], *, stream: TextIO
) -> None:
    for line in _blockers(plan, topology, work_queues):
        print(f"✗ {line}", file=stream)


def _print_kept(topology: DelayTopology, kept: list[str], *, stream: TextIO) -> None:
    """The forwarding the chain has that this teardown leaves, one exchange a line."""
    for exchange in kept:
        print(
            f"kept: forwarding to exchange {exchange!r} ({topology.prefix}.forward.{exchange}, "
            f"{exchange}.delay and their parking queues); --forward {exchange} or "
            "--forwarding removes it",
            file=stream,
        )


def _print_left_behind(
    topology: DelayTopology, left: dict[str, str] | None, *, stream: TextIO
) -> None:
    """Say which parking queues of other work queues the teardown leaves, or that it cannot see."""
    if left is None:
        print(
            "note: other work queues' parking queues bound to the chain cannot be listed without "
            "the management API (--management-url); those not named with --queue are left behind",
            file=stream,
        )
        return
    for queue, work_queue in left.items():
        print(
            f"left behind: parking queue {queue!r} of work queue {work_queue!r} is bound to the "
            f"chain's parking exchange {topology.parking_exchange!r}; add --queue {work_queue} "
            "to remove it too",
            file=stream,
        )


def _print_plan(plan: TeardownPlan, topology: DelayTopology, work_queues: list[str]) -> None:
    _print_blockers(plan, topology, work_queues, stream=sys.stdout)
    if plan.queues or plan.exchanges:
        print(
            f"chain {topology.prefix!r}: {len(plan.queues)} queue(s) and "
            f"{len(plan.exchanges)} exchange(s) to remove:"
        )
        for name in plan.queues:
            held = plan.discard.get(name)
            alerts = (topology.alerts_queue, topology.mutes_stream)
            option = "--purge-alerts" if name in alerts else "--discard-waiting"
            note = f" (with its {held} message(s), {option})" if held else ""
            print(f"  queue    {name}{note}")
        for name in plan.exchanges:
            print(f"  exchange {name}")
    if plan.missing:
        print(f"{len(plan.missing)} object(s) already absent")


def _refusal(plan: TeardownPlan, topology: DelayTopology, work_queues: list[str]) -> str:
    names = list(dict.fromkeys([*plan.not_empty, *plan.consumers]))
    state = (
        "not empty and in use"
        if plan.not_empty and plan.consumers
        else ("not empty" if plan.not_empty else "in use")
    )
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"chain {topology.prefix!r} is {state} ({shown}); nothing removed; each queue in the "
        "way is listed above (✗) with what empties it"
    )


def _stopped(plan: TeardownPlan, outcome: TeardownOutcome, topology: DelayTopology) -> str:
    kept = len(plan.queues) - len(outcome.queues)
    gone = (
        f"the {len(outcome.queues)} queue(s) before it are gone: run 'delayed-retry declare "
        f"{common.topology_options(topology)}' to restore the chain for what waits in it"
        if outcome.queues
        else "nothing was removed"
    )
    return (
        f"queue {outcome.refused!r} {outcome.reason} since it was checked, so the teardown "
        f"stopped there: it and the {kept - 1} queue(s) after it were kept, with every "
        f"exchange of the chain; {gone}. Run the teardown again once it is empty"
    )


async def _teardown(args: argparse.Namespace) -> int:
    topology = common.topology_from_args(args)
    found = await found_forwarding(
        common.management_client(args, timeout=BEST_EFFORT_TIMEOUT), topology
    )
    if args.forwarding and found is None:
        raise output.CommandError(
            "--forwarding reads the forward queues from the management API, which did not "
            "answer; name each exchange with --forward EXCHANGE, or pass --management-url"
        )
    forwarding = [*args.forward, *(found or [] if args.forwarding else [])]
    kept = [exchange for exchange in found or [] if exchange not in forwarding]
    removing = [s.name for s in deletion_order(topology, args.queue, [*forwarding, *kept])]
    left = await other_parking_queues(
        common.management_client(args, timeout=BEST_EFFORT_TIMEOUT), topology, removing=removing
    )
    connection = await connect(args.url)
    async with connection:
        plan = await plan_teardown(
            connection,
            topology,
            queues=args.queue,
            discard_alerts=args.purge_alerts,
            discard_waiting=args.discard_waiting,
            forwarding=dict.fromkeys(forwarding),
        )
        note = sys.stderr if args.json else sys.stdout
        if args.json:
            output.emit_json(
                {
                    "dry_run": args.dry_run,
                    "queues": plan.queues,
                    "exchanges": plan.exchanges,
                    "not_empty": plan.not_empty,
                    "consumers": plan.consumers,
                    "discard": plan.discard,
                    "missing": plan.missing,
                    "forwarding": plan.forwarding,
                    "forwarding_kept": kept,
                }
            )
            _print_blockers(plan, topology, args.queue, stream=sys.stderr)
        else:
            _print_plan(plan, topology, args.queue)
        _print_kept(topology, kept, stream=note)
        _print_left_behind(topology, left, stream=note)
        if plan.blocked:
            raise output.CommandError(_refusal(plan, topology, args.queue))
        if not plan.queues and not plan.exchanges:
            print(f"nothing to remove: chain {topology.prefix!r} does not exist", file=note)
            return 0
        if args.dry_run:
            print("dry run: nothing removed", file=note)
            return 0
        waiting = sum(n for q, n in plan.discard.items() if topology.is_level_queue(q))
        discarding = (
            f", discarding the {waiting} message(s) still waiting in it (never delivered)"
            if waiting
            else ""
        )
        question = (
            f"remove {len(plan.queues)} queue(s) and {len(plan.exchanges)} exchange(s) of "
            f"chain {topology.prefix!r}{discarding}?"
        )
        if not output.confirm(question, assume_yes=args.yes):
            raise output.CommandError("not confirmed; nothing removed")
        outcome = await tear_down(connection, plan)
    if outcome.refused is not None:
        raise output.CommandError(_stopped(plan, outcome, topology))
    print(
        f"removed chain {topology.prefix!r}: {len(outcome.queues)} queue(s), "
        f"{len(outcome.exchanges)} exchange(s)",
        file=note,
    )
    return 0


COMMAND = Command(
    name="teardown",
    help="remove a chain's queues and exchanges when they are empty",
    description="Delete the level, unroutable, rejected and alerts queues and every "
    "exchange of the chain the topology options describe (and QUEUE.parking for each "
    "--queue), only when none holds a message or has a consumer: otherwise nothing is "
    "deleted, and each queue in the way is named with its count and the command that "
    "empties it. Each queue is checked again as it is deleted (classic queues with "
    "if-empty; quorum queues, which refuse it, with a check just before); one found in "
    "use stops the teardown there, keeping it, the queues after it and every exchange. "
    "What forwarders and front doors declared for the chain is listed, and removed with "
    "--forwarding or --forward. Messages still waiting in the levels block it unless "
    "--discard-waiting. Asks for confirmation unless --yes. Exit status: 0 removed (or "
    "nothing to remove), 1 refused, not confirmed or refused by the broker, 2 usage or "
    "connection error.",
    options=_options,
    run=_teardown,
)
