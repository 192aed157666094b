"""The options the parking commands share (the queue, which parked messages) and the
filter they describe.

Use :func:`add_queue_args` and :func:`add_filter_args` when adding a parking verb, and
:func:`filter_from_args` and :func:`lot_from_args` in its action; ``--id`` prefixes are
resolved by :mod:`delayed_retry.cli.parking_ids`.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TypedDict

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli import output
from delayed_retry.parking.lot import ParkedFilter

__all__ = ["Lot", "add_filter_args", "add_queue_args", "filter_from_args", "lot_from_args"]


def add_queue_args(parser: argparse.ArgumentParser) -> None:
    """``--queue`` and ``--parking-queue``: whose parking lot a verb uses."""
    parser.add_argument("--queue", required=True, help="the work queue whose parking lot to use")
    parser.add_argument("--parking-queue", help="parking queue name if not QUEUE.parking")


def add_filter_args(parser: argparse.ArgumentParser, *, ids: bool = True) -> None:
    """The filter options (all given must match); ``--id`` too unless ``ids=False``."""
    group = parser.add_argument_group("which parked messages (all given must match)")
    if ids:
        group.add_argument(
            "--id",
            dest="ids",
            action="append",
            default=[],
            metavar="ID",
            help="a record id as 'parking list' shows it, or its start (repeatable)",
        )
    group.add_argument("--exception", metavar="TYPE", help="exception type, e.g. TimeoutError")
    group.add_argument("--reason", help="parked reason, e.g. max-retries, not-retryable")
    group.add_argument(
        "--older-than", type=output.duration_type, metavar="AGE", help="parked before, e.g. 2h"
    )
    group.add_argument(
        "--newer-than", type=output.duration_type, metavar="AGE", help="parked within, e.g. 15m"
    )
    output.add_header_option(group, "--header", help="header NAME contains TEXT (repeatable)")
    group.add_argument("--body-contains", metavar="TEXT", help="the body contains TEXT")
    group.add_argument("--group", metavar="FINGERPRINT", help="a failure group from 'parking list'")


def filter_from_args(args: argparse.Namespace) -> ParkedFilter:
    """The parked-message filter the options of :func:`add_filter_args` describe."""
    return ParkedFilter(
        ids=frozenset(getattr(args, "ids", ())),
        exception_type=args.exception,
        reason=args.reason,
        older_than=None if args.older_than is None else timedelta(seconds=args.older_than),
        newer_than=None if args.newer_than is None else timedelta(seconds=args.newer_than),
        headers=tuple(args.header),
        body_contains=args.body_contains,
        fingerprint=args.group,
    )


class Lot(TypedDict):
    """The keyword arguments that name a parking lot to the parking functions: spread it
    (``**lot_from_args(args, topology)``) into any call of a parking verb's action."""

    queue: str
    parking_queue: str | None
    topology: DelayTopology


def lot_from_args(args: argparse.Namespace, topology: DelayTopology) -> Lot:
    """The parking lot the options of :func:`add_queue_args` name, in ``topology``: the keyword
    arguments ``queue``, ``parking_queue`` and ``topology`` of the parking functions."""
    return {"queue": args.queue, "parking_queue": args.parking_queue, "topology": topology}
