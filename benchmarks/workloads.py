"""The suite's named workloads: the registry ``benchmarks/run --only NAME`` chooses from.

A workload is a function ``async def NAME(suite: Suite) -> list[Row]``, named after it
(``-`` as ``_``), in a module of ``benchmarks/`` (one module may hold several), plus one
:class:`Workload` entry in :data:`WORKLOADS`. A module whose workloads take options of
their own defines ``add_arguments(parser)`` (options prefixed with the workload's name);
one that explains its rows beyond the table defines ``details(rows) -> str``. Every row is
measured beside a baseline of the same run and carries the ratio (see :mod:`report` for
the columns). Modules are imported for ``--help``, so they import heavy packages (peers,
Spark) inside functions.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from harness import RabbitMQNode

Row = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Suite:
    """What a workload is given: the suite's broker and the parsed command line."""

    args: argparse.Namespace
    url: str
    """The suite's broker: its private node, or ``--url``."""
    node: RabbitMQNode | None
    """The private node, None with ``--url``."""

    @property
    def quick(self) -> bool:
        return bool(self.args.quick)

    @property
    def broker_pid(self) -> int | None:
        """The broker VM's process id, for its CPU time (None with ``--url``)."""
        return self.node.beam_pid if self.node is not None else None


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One entry of the registry: a name, where its function lives, and when it runs."""

    name: str
    module: str
    """The module in ``benchmarks/`` that defines the function named after the workload."""
    summary: str
    """One line for ``benchmarks/run --list``."""
    default: bool = True
    """Run by a plain ``benchmarks/run``; False: only when named with ``--only`` (long,
    noisy, or needing nodes, versions or Spark of its own)."""
    suite_broker: bool = True
    """It uses the suite's broker (its private node, or ``--url``); False: it needs none, or
    starts the nodes it needs, so the suite starts no node for it."""

    def load(self) -> Callable[[Suite], Awaitable[list[Row]]]:
        """The workload's function, its module imported."""
        found: Callable[[Suite], Awaitable[list[Row]]] = getattr(
            importlib.import_module(self.module), self.name.replace("-", "_")
        )
        return found


WORKLOADS = (
    Workload(
        name="overhead",
        module="overhead",
        summary="success and retry paths' own CPU, no broker (rows: success, retry)",
        suite_broker=False,
    ),
    Workload(
        name="throughput",
        module="throughput",
        summary="CPU per message: success, retry-0hop, retry-1hop beside plain and hand-rolled",
    ),
    Workload(
        name="ordering",
        module="ordering",
        summary="what ordered_by= costs: ordered / unordered consumer (rows: ordered-success, "
        "ordered-retry)",
        default=False,
    ),
    Workload(
        name="precision",
        module="precision",
        summary="lateness of held and unheld delays at --rates beside a plain consumer",
    ),
    Workload(
        name="hops",
        module="hops",
        summary="how late the chain lets a message out, by TTL hops (the hold's lead)",
    ),
    Workload(
        name="faststream",
        module="faststream_overhead",
        summary="DelayedRetry in a FastStream app: success and retry beside plain FastStream",
        default=False,
    ),
    Workload(
        name="peers",
        module="peers",
        summary="Dramatiq's success and one-retry paths beside a plain consumer",
    ),
    Workload(
        name="peer-success",
        module="storm",
        summary="every peer's worker, no failure (eight worker starts: noisy)",
        default=False,
    ),
    Workload(
        name="storm",
        module="storm",
        summary="every peer under a retry storm: time to the last success beside the ideal",
    ),
    Workload(
        name="crash",
        module="storm",
        summary="every peer killed -9 in a storm and restarted: messages lost or doubled",
    ),
    Workload(
        name="long-delay",
        module="storm",
        summary="backoffs longer than consumer_timeout, on a private node of its own",
        suite_broker=False,
    ),
    Workload(
        name="peer-precision",
        module="peer_precision",
        summary="lateness of Celery's and Dramatiq's delayed tasks beside delayed-retry",
    ),
    Workload(
        name="capacity",
        module="capacity",
        summary="many delayed 1 KB messages waiting: broker memory, disk, the drain",
        default=False,
    ),
    Workload(
        name="cluster",
        module="cluster",
        summary="a 3-node cluster: the busiest node's share of broker CPU, leaders on one node "
        "and spread",
        default=False,
        suite_broker=False,
    ),
    Workload(
        name="broker-cost",
        module="broker_cost",
        summary="held/unheld chain cost: broker CPU and routings per delayed message",
        default=False,
        suite_broker=False,
    ),
    Workload(
        name="broker-limit",
        module="broker_limit",
        summary="CPU of broker, consumer and producer for delayed streams at one rate",
        default=False,
        suite_broker=False,
    ),
    Workload(
        name="throttle",
        module="throttle_outage",
        summary="a dependency outage with and without the throttle: retries spent, parkings",
        default=False,
    ),
    Workload(
        name="parking-disk",
        module="parking_disk",
        summary="a long-parked message and the quorum log's disk, per RabbitMQ version",
        default=False,
        suite_broker=False,
    ),
    Workload(
        name="spark-analyze",
        module="spark_analyze",
        summary="spark analyze beside a single-process pyarrow computation",
        default=False,
        suite_broker=False,
    ),
    Workload(
        name="spark-schedule",
        module="spark_schedule",
        summary="bulk scheduling and redrive with Spark beside one aio-pika publisher",
        default=False,
    ),
)


def modules() -> list[ModuleType]:
    """Every registered workload's module, imported once each, in registry order."""
    seen: dict[str, ModuleType] = {}
    for workload in WORKLOADS:
        if workload.module not in seen:
            seen[workload.module] = importlib.import_module(workload.module)
    return list(seen.values())
