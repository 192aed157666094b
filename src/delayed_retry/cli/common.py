"""Options and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

from delayed_retry.topology import DelayTopology

__all__ = ["add_topology_args", "topology_from_args"]


def add_topology_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--prefix``, ``--levels``, ``--unit-ms`` and ``--queue-type`` to ``parser``."""
    defaults = DelayTopology()
    group = parser.add_argument_group("delay topology (must match the consumers')")
    group.add_argument(
        "--prefix",
        default=None,
        help=f"name prefix (default: $DELAYED_RETRY_PREFIX or {defaults.prefix})",
    )
    group.add_argument("--levels", type=int, default=defaults.levels, help="levels (%(default)s)")
    group.add_argument(
        "--unit-ms", type=int, default=defaults.unit_ms, help="delay unit in ms (%(default)s)"
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


def topology_from_args(args: argparse.Namespace) -> DelayTopology:
    """The :class:`DelayTopology` the options describe."""
    prefix = args.prefix or os.environ.get("DELAYED_RETRY_PREFIX") or DelayTopology().prefix
    if getattr(args, "nservicebus", False):
        return DelayTopology.nservicebus(prefix=prefix)
    return DelayTopology(
        prefix=prefix,
        levels=args.levels,
        unit=timedelta(milliseconds=args.unit_ms),
        queue_type=args.queue_type,
    )
