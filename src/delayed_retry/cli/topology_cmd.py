"""``delayed-retry topology verify|show|rebalance|migrate|discard``: check the live chain, see
what waits in it, spread its leaders over a cluster.

``migrate`` lives in :mod:`delayed_retry.cli.topology_migrate_cmd`, ``discard`` in
:mod:`delayed_retry.cli.topology_discard_cmd`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import aio_pika

from delayed_retry.admin.chain_bindings import binding_style
from delayed_retry.admin.chain_diff import Difference, compare
from delayed_retry.admin.chain_probe import level_depths, probe_over_amqp, queue_depth
from delayed_retry.admin.live_chain import LiveChain
from delayed_retry.admin.management import ManagementError
from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.chain.leaders import (
    leader_policies,
    leader_spread,
    lopsided_warning,
    rebalance_command,
)
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli import common, output
from delayed_retry.cli.command import Command
from delayed_retry.cli.topology_discard_cmd import DISCARD, EXPEDITE
from delayed_retry.cli.topology_migrate_cmd import MIGRATE
from delayed_retry.durations import format_duration
from delayed_retry.rabbitmq.urls import redact_url, vhost_of
from delayed_retry.rabbitmq.versions import broker_major_version

__all__ = ["COMMAND"]


def _verify_options(parser: argparse.ArgumentParser) -> None:
    common.add_topology_args(parser)
    common.add_queues_option(
        parser, help="also check QUEUE's binding to the chain and its parking queue (repeatable)"
    )
    common.add_management_option(parser, purpose="reading bindings and policies")
    parser.add_argument(
        "--no-management", action="store_true", help="check over AMQP only, without the HTTP API"
    )
    output.add_json_option(parser)


def _show_options(parser: argparse.ArgumentParser) -> None:
    common.add_topology_args(parser)
    parser.add_argument("--all", action="store_true", help="also list empty levels")
    output.add_json_option(parser)


def _rebalance_options(parser: argparse.ArgumentParser) -> None:
    common.add_topology_args(parser)
    parser.add_argument(
        "--rabbitmq-major",
        type=int,
        metavar="N",
        default=None,
        help="the broker's major version (3 or 4) instead of connecting to ask it",
    )
    output.add_json_option(parser)


async def _verify(args: argparse.Namespace) -> int:
    topology = common.topology_from_args(args)
    queues = tuple(args.queue)
    note: str | None = None
    differences: list[Difference]
    if not args.no_management:
        try:
            live = await common.management_client(args).live_chain()
        except ManagementError as exc:
            note = f"{exc}. Checked existence and arguments over AMQP only"
        else:
            differences = compare(
                topology, live, options=common.topology_options(topology), queues=queues
            )
            style = binding_style(topology, live.bindings)
            return _report(
                args,
                topology,
                differences,
                checked="management API",
                note=None,
                bindings=style,
                warnings=_leader_warnings(topology, live, vhost=vhost_of(args.url)),
            )
    else:
        note = "--no-management: checked existence and arguments over AMQP only"
    connection = await aio_pika.connect(args.url)
    async with connection:
        differences = await probe_over_amqp(
            connection, topology, options=common.topology_options(topology), queues=queues
        )
    note = f"{note}; bindings, alternate exchanges in use and policies were NOT checked"
    return _report(args, topology, differences, checked="AMQP", note=note)


def _report(
    args: argparse.Namespace,
    topology: DelayTopology,
    differences: list[Difference],
    *,
    checked: str,
    note: str | None,
    bindings: str | None = None,
    warnings: list[str] | None = None,
) -> int:
    warnings = warnings or []
    if args.json:
        output.emit_json(
            {
                "prefix": topology.prefix,
                "checked_through": checked,
                "complete": note is None,
                "note": note,
                # skip-zeros | pass-through | mixed | incomplete; null when not read.
                "bindings": bindings,
                "differences": differences,
                "warnings": warnings,
            }
        )
    else:
        if note:
            print(f"note: {note}", file=sys.stderr)
        for warning in warnings:
            print(f"! {warning}")
        for difference in differences:
            print(f"✗ {difference.line()}")
        if differences:
            print(
                f"{len(differences)} difference(s) between the live chain {topology.prefix!r} "
                f"at {redact_url(args.url)} and the configuration"
            )
        else:
            print(
                f"✓ the live chain {topology.prefix!r} matches the configuration "
                f"({topology.levels} levels of {topology.unit_ms} ms, {topology.queue_type}"
                + ("" if bindings is None else f", {bindings} bindings")
                + ")"
                + ("" if note is None else ", as far as AMQP can tell")
            )
    return 1 if differences else 0


def _leader_warnings(topology: DelayTopology, live: LiveChain, *, vhost: str) -> list[str]:
    """A warning when one node leads more than its share of the chain's levels (a cluster)."""
    leaders = {name: queue.leader for name, queue in live.queues.items()}
    nodes = {
        member
        for level in range(topology.levels)
        if (queue := live.queues.get(topology.level_name(level))) is not None
        for member in queue.members
    }
    warning = lopsided_warning(topology, leader_spread(topology, leaders), nodes=nodes, vhost=vhost)
    return [] if warning is None else [warning]


async def _rebalance(args: argparse.Namespace) -> int:
    topology = common.topology_from_args(args)
    vhost = vhost_of(args.url)
    major = args.rabbitmq_major
    if major is None:
        connection = await aio_pika.connect(args.url)
        async with connection:
            underlay = await underlay_channel(await connection.channel())
            major = broker_major_version(getattr(underlay.connection, "server_properties", None))
    policies = leader_policies(topology, broker_major=major)
    rebalance = rebalance_command(topology, vhost=vhost)
    if args.json:
        output.emit_json(
            {
                "prefix": topology.prefix,
                "vhost": vhost,
                "policies": [policy.command(vhost=vhost) for policy in policies],
                "rebalance": rebalance,
            }
        )
        return 0
    print("# once per vhost: queues of the chain declared from now on spread their leaders")
    for policy in policies:
        print(policy.command(vhost=vhost))
    print("# the chain's existing quorum queues: leaders moved, messages kept")
    print(rebalance)
    return 0


async def _show(args: argparse.Namespace) -> int:
    topology = common.topology_from_args(args)
    connection = await aio_pika.connect(args.url)
    async with connection:
        depths = await level_depths(connection, topology)
        others = {
            "unroutable": await queue_depth(connection, topology.unroutable_queue),
            "rejected": await queue_depth(connection, topology.rejected_queue),
            "alert copies": await queue_depth(connection, topology.alerts_queue),
        }
    unit = topology.unit_ms / 1000
    rows = []
    for depth in depths:
        hold = (1 << depth.level) * unit
        rows.append(
            {
                "level": depth.level,
                "queue": depth.name,
                "holds_seconds": hold,
                # Delays entering at this level: its bit is the highest 1.
                "entering_delays_seconds": [hold, ((2 << depth.level) - 1) * unit],
                "messages": depth.messages,
                # Up to a full hold here, then up to every lower bit.
                "due_within_seconds": ((2 << depth.level) - 1) * unit,
            }
        )
    if args.json:
        output.emit_json({"prefix": topology.prefix, "levels": rows, "queues": others})
    else:
        _print_show(args, topology, rows, others)
    missing = [r["queue"] for r in rows if r["messages"] is None]
    missing += [k for k, v in others.items() if v is None]
    if missing:
        raise output.CommandError(
            f"{len(missing)} queue(s) of the chain are missing; check --prefix/--levels, or run "
            "'delayed-retry topology verify' with the same options"
        )
    return 0


def _print_show(
    args: argparse.Namespace,
    topology: DelayTopology,
    rows: list[dict[str, Any]],
    others: dict[str, int | None],
) -> None:
    print(
        f"chain {topology.prefix!r}: {topology.levels} levels of "
        f"{format_duration(topology.unit_ms / 1000)} ({topology.queue_type}), longest delay "
        f"{format_duration(topology.max_delay.total_seconds())}"
    )
    shown = [r for r in rows if args.all or r["messages"] != 0]
    if shown:
        table = []
        for r in shown:
            low, high = r["entering_delays_seconds"]
            table.append(
                (
                    r["level"],
                    format_duration(r["holds_seconds"]),
                    f"{format_duration(low)} – {output.format_at_most(high)}",
                    "missing" if r["messages"] is None else r["messages"],
                    f"within {output.format_at_most(r['due_within_seconds'])}"
                    if r["messages"]
                    else "",
                )
            )
        output.print_table(
            ("level", "holds", "delays entering", "messages", "due"), table, right=(0, 3)
        )
    hidden = len(rows) - len(shown)
    if hidden:
        print(f"({hidden} empty level(s) hidden; --all lists them)")
    waiting = sum(r["messages"] or 0 for r in rows)
    if waiting:
        latest = max(r["due_within_seconds"] for r in rows if r["messages"])
        print(f"{waiting} message(s) waiting, all due within {output.format_at_most(latest)}")
    else:
        print("no message waiting in the chain")
    print("   ".join(f"{k}: {'missing' if v is None else v}" for k, v in others.items()))


VERIFY = Command(
    name="verify",
    help="compare the live chain with the configuration; exit 1 on any difference",
    description="Compare the live chain (exchanges, queues, arguments, bindings, alternate "
    "exchanges, policies that apply) with the configuration and print each difference "
    "with its fix. Bindings and policies are read through the management HTTP API when it "
    "is reachable; otherwise only what AMQP can check is checked, and the output says so. "
    "Read-only. Exit status: 0 no difference, 1 differences, 2 usage or connection error.",
    options=_verify_options,
    run=_verify,
)

SHOW = Command(
    name="show",
    help="levels with their delay range, messages per level, and when they are due",
    description="Show each level of the chain: how long it holds a message, which delays "
    "enter there, how many messages wait in it and the latest they are due. Read-only. "
    "'topology discard --dry-run --queue QUEUE' lists the messages waiting for QUEUE, "
    "with their ids and due times.",
    options=_show_options,
    run=_show,
)

REBALANCE = Command(
    name="rebalance",
    help="print the commands that spread the chain's queue leaders over a cluster's nodes",
    description="Print the policies that spread the leaders of the chain's queues declared "
    "from now on (set them once per vhost), and the rabbitmq-queues command that moves "
    "the leaders of the chain's existing quorum queues so that no node leads more than "
    "its share; run both on a broker node. Messages waiting in the chain stay where they "
    "are (Raft leadership transfer). The broker's version decides the policies: it is "
    "asked over AMQP unless --rabbitmq-major is given. docs/operating-the-chain.md "
    "explains the choice.",
    options=_rebalance_options,
    run=_rebalance,
)

COMMAND = Command(
    name="topology",
    help="verify the live chain against the configuration, show what waits, migrate, "
    "discard waiting messages",
    description="Operate on the delay chain as a whole.",
    verbs=(VERIFY, SHOW, REBALANCE, MIGRATE, DISCARD, EXPEDITE),
)
