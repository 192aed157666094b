"""``delayed-retry topology migrate``: move what waits in another chain into this one."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

import aio_pika

from delayed_retry.admin.chain_migration import migrate_chain, source_depths
from delayed_retry.admin.other_chains import SourceChain
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli import common, output
from delayed_retry.cli.command import Command

__all__ = ["MIGRATE", "source_from_args"]


def _options(parser: argparse.ArgumentParser) -> None:
    common.add_topology_args(parser)
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        choices=("delayed-retry", "kombu", "nservicebus"),
        help="the kind of chain to empty",
    )
    parser.add_argument(
        "--from-prefix",
        default=None,
        help="the source's prefix (delayed-retry: required; kombu: its optional prefix)",
    )
    parser.add_argument("--from-levels", type=int, default=36, help="delayed-retry source levels")
    parser.add_argument(
        "--from-unit-ms", type=int, default=1, help="delayed-retry source unit in ms (1)"
    )
    parser.add_argument(
        "--to",
        dest="to_queue",
        metavar="QUEUE",
        default=None,
        help="destination queue for every message (Kombu's keys name a routing key, not a queue)",
    )
    parser.add_argument(
        "--map",
        metavar="KEY=QUEUE",
        action="append",
        default=[],
        help="destination queue for messages whose key ends in KEY (repeatable)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="count what would move; read and move nothing"
    )
    output.add_json_option(parser)


def source_from_args(args: argparse.Namespace) -> SourceChain:
    """The :class:`SourceChain` the ``--from`` options describe."""
    if args.source == "kombu":
        return SourceChain.kombu(prefix=args.from_prefix)
    if args.source == "nservicebus":
        return SourceChain.nservicebus()
    if not args.from_prefix:
        raise output.UsageError(
            "--from delayed-retry needs --from-prefix (and --from-levels/--from-unit-ms when "
            "they were not the defaults): the settings the old chain was declared with"
        )
    old = DelayTopology(
        prefix=args.from_prefix,
        levels=args.from_levels,
        unit=timedelta(milliseconds=args.from_unit_ms),
    )
    return SourceChain.ours(old)


def _mapping(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, queue = item.partition("=")
        if not sep or not key or not queue:
            raise output.UsageError(f"--map {item!r} is not KEY=QUEUE, e.g. --map celery=tasks")
        out[key] = queue
    return out


async def _migrate(args: argparse.Namespace) -> int:
    source = source_from_args(args)
    target = common.topology_from_args(args)
    mapping = _mapping(args.map)
    connection = await aio_pika.connect(args.url)
    async with connection:
        depths = await source_depths(connection, source)
        if all(count is None for _, _, count in depths):
            raise output.UsageError(
                f"no queue of the {source.label} exists (looked for {source.level_name(0)!r} "
                f"… {source.level_name(source.levels - 1)!r}); check --from and --from-prefix"
            )
        if args.dry_run:
            return _print_dry_run(args, source, target, depths)
        total = sum(count or 0 for _, _, count in depths)
        with output.progress_bar(
            "moving", total=total, enabled=None if not args.json else False
        ) as bar:
            moved = 0

            def advance(n: int) -> None:
                nonlocal moved
                moved += n
                bar(moved, None)

            report = await migrate_chain(
                connection,
                source=source,
                target=target,
                destinations=mapping,
                default_destination=args.to_queue,
                on_move=advance,
            )
    rows: list[dict[str, Any]] = [
        {
            "level": r.level,
            "queue": r.queue,
            "moved": r.moved,
            "left": r.left,
            "problems": r.problems,
        }
        for r in sorted(report.levels.values(), key=lambda r: r.level)
        if r.moved or r.left or r.problems
    ]
    if args.json:
        output.emit_json({"moved": report.moved, "left": report.left, "levels": rows})
    else:
        for row in rows:
            print(f"{row['queue']}: moved {row['moved']}, left {row['left']}")
            for problem, count in row["problems"].items():
                print(f"  {count} stayed: {problem}")
        print(
            f"moved {report.moved} message(s) from the {source.label} into "
            f"{target.prefix!r}; {report.left} still wait in the source"
        )
    return 1 if report.left else 0


def _print_dry_run(
    args: argparse.Namespace,
    source: SourceChain,
    target: DelayTopology,
    depths: list[tuple[int, str, int | None]],
) -> int:
    rows: list[dict[str, Any]] = []
    for level, name, count in depths:
        if not count:
            continue
        latest = ((2 << level) - 1) * source.unit_ms / 1000
        rows.append(
            {"level": level, "queue": name, "messages": count, "due_within_seconds": latest}
        )
    total = sum(r["messages"] for r in rows)
    if args.json:
        output.emit_json({"dry_run": True, "would_move": total, "levels": rows})
        return 0
    for r in rows:
        within = output.format_at_most(r["due_within_seconds"])
        print(f"{r['queue']}: {r['messages']} message(s), due within {within}")
    print(
        f"dry run: would move {total} message(s) from the {source.label} into "
        f"{target.prefix!r}; nothing was read or moved",
        file=sys.stdout,
    )
    return 0


MIGRATE = Command(
    name="migrate",
    help="move messages waiting in another delay chain into this one, never early",
    description="Move the messages waiting in another delay chain into the chain the "
    "topology options describe, each re-scheduled for its remaining delay: exactly when "
    "a header records its due time (ours, Celery's eta), otherwise for the latest it "
    "could be due (a full wait in its level plus its lower routing-key bits), so never "
    "early. At-least-once: a message leaves the source only after the target confirmed "
    "its copy; one that cannot move stays where it was. Exit status: 0 all moved, 1 some "
    "stayed, 2 usage or connection error.",
    options=_options,
    run=_migrate,
)
