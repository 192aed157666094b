"""Options and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

from delayed_retry.admin.management import (
    DEFAULT_HTTP_PORT,
    DEFAULT_HTTPS_PORT,
    DEFAULT_TIMEOUT,
    ManagementClient,
)
from delayed_retry.chain.topology import DelayTopology

__all__ = [
    "MANAGEMENT_URL_ENV",
    "add_management_option",
    "add_queues_option",
    "add_topology_args",
    "management_client",
    "management_url_from",
    "topology_from_args",
    "topology_options",
]

MANAGEMENT_URL_ENV = "RABBITMQ_MANAGEMENT_URL"
"""The environment variable that gives the management API's address when no option does."""


def add_topology_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--prefix``, ``--levels``, ``--unit-ms`` and ``--queue-type`` to ``parser``."""
    defaults = DelayTopology()
    group = parser.add_argument_group("delay topology (must match the consumers')")
    group.add_argument(
        "--prefix",
        default=None,
        help=f"name prefix (default: $DELAYED_RETRY_PREFIX or {defaults.prefix})",
    )
    group.add_argument(
        "--levels",
        type=int,
        default=None,
        help=f"levels (default: {defaults.levels}, or the chain QUEUE is bound to when neither "
        "--prefix nor --levels is given)",
    )
    group.add_argument(
        "--unit-ms",
        type=_milliseconds,
        default=defaults.unit_ms,
        help="delay unit in ms (%(default)s)",
    )
    group.add_argument(
        "--queue-type",
        choices=("quorum", "classic"),
        default=defaults.queue_type,
        help="queue type of the chain (%(default)s)",
    )
    group.add_argument(
        "--nservicebus",
        action="store_true",
        help="use NServiceBus's v2 chain (nsb.v2.delay-level-NN, 28 levels of 1 s, quorum); "
        "--levels, --unit-ms and --queue-type are then ignored",
    )


def _milliseconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of milliseconds of at least 1, e.g. 1 or 1000"
        )
    return value


def topology_from_args(args: argparse.Namespace) -> DelayTopology:
    """The :class:`DelayTopology` the options describe."""
    prefix = args.prefix or os.environ.get("DELAYED_RETRY_PREFIX") or DelayTopology().prefix
    if getattr(args, "nservicebus", False):
        return DelayTopology.nservicebus(prefix=prefix)
    return DelayTopology(
        prefix=prefix,
        levels=DelayTopology().levels if args.levels is None else args.levels,
        unit=timedelta(milliseconds=args.unit_ms),
        queue_type=args.queue_type,
    )


def topology_options(topology: DelayTopology) -> str:
    """The command-line options that select ``topology``: what :func:`topology_from_args` reads.

    Use it wherever a message tells an operator which command to run on this chain.
    """
    if topology.naming == "nservicebus-v2":
        return f"--prefix {topology.prefix} --nservicebus"
    return (
        f"--prefix {topology.prefix} --levels {topology.levels} "
        f"--unit-ms {topology.unit_ms} --queue-type {topology.queue_type}"
    )


def add_management_option(parser: argparse.ArgumentParser, *, purpose: str) -> None:
    """Add ``--management-url`` to a command that reads the management API for ``purpose``."""
    parser.add_argument(
        "--management-url",
        metavar="URL",
        default=None,
        help=f"management HTTP API, for {purpose} (default: ${MANAGEMENT_URL_ENV}, else "
        f"--url's host and credentials: http on {DEFAULT_HTTP_PORT} for amqp://, https on "
        f"{DEFAULT_HTTPS_PORT} for amqps://)",
    )


def add_queues_option(
    parser: argparse.ArgumentParser, *, help: str, required: bool = False
) -> None:
    """Add ``--queue QUEUE``, given once per queue, to a command that acts on a list of queues."""
    if required:
        parser.add_argument("--queue", metavar="QUEUE", action="append", required=True, help=help)
    else:
        parser.add_argument("--queue", metavar="QUEUE", action="append", default=[], help=help)


def management_url_from(args: argparse.Namespace) -> str | None:
    """``--management-url`` when the command has it and it was given, else the environment's."""
    return getattr(args, "management_url", None) or os.environ.get(MANAGEMENT_URL_ENV) or None


def management_client(
    args: argparse.Namespace, *, timeout: float = DEFAULT_TIMEOUT
) -> ManagementClient:
    """The management API client of the broker at ``--url``, by the rules every command shares."""
    return ManagementClient.for_broker(
        args.url, management_url=management_url_from(args), timeout=timeout
    )
