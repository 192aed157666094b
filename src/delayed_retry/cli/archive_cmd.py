"""``delayed-retry archive``: drain a parking queue into Parquet files."""

from __future__ import annotations

import argparse
import asyncio

from delayed_retry.cli import common, output
from delayed_retry.cli.command import Command

__all__ = ["COMMAND"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", required=True, help="the parking queue, e.g. orders.parking")
    parser.add_argument("--to", required=True, help="folder or URI (s3://…) of the archive")
    parser.add_argument(
        "--batch-size", type=output.count_type(1), default=1000, help="messages per part file"
    )
    parser.add_argument(
        "--idle-timeout",
        type=output.duration_type,
        default=1.0,
        help="stop after the queue is empty this long, e.g. 1s, 500ms (1s)",
    )
    parser.add_argument(
        "--max", type=output.count_type(1), default=None, help="archive at most this many messages"
    )
    parser.add_argument(
        "--force", action="store_true", help="drain a queue whose name does not end in .parking"
    )
    common.add_topology_args(parser)


def _archive(args: argparse.Namespace) -> int:
    if not args.queue.endswith(".parking") and not args.force:
        raise output.UsageError(
            f"--queue {args.queue!r} is not a parking queue (QUEUE.parking): archive drains it, "
            f"taking messages away from its consumers. Did you mean --queue {args.queue}.parking? "
            "Add --force to drain this queue anyway"
        )
    output.require_extra("spark", ("pyarrow",), what="'delayed-retry archive'")
    from delayed_retry.spark.archive import archive

    result = asyncio.run(
        archive(
            args.url,
            queue=args.queue,
            to=args.to,
            batch_size=args.batch_size,
            idle_timeout=args.idle_timeout,
            max_messages=args.max,
            topology=common.topology_from_args(args),
        )
    )
    print(
        f"archived {output.counted(result.messages, 'message')} of {result.queue!r} in "
        f"{output.counted(len(result.files), 'file')}"
    )
    return 0


COMMAND = Command(
    name="archive",
    help="drain a parking queue into Parquet files (acked only once written)",
    description="Drain a parking queue into Parquet files partitioned by date and queue.",
    options=_options,
    run=_archive,
)
