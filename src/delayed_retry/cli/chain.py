"""Check that the chain the options describe is the one on the broker, before acting on it.

A wrong or missing ``--prefix``/``--levels`` must not silently bind a queue to
a chain nobody consumes from. :func:`checked_topology` looks at the broker:
the chain's delivery exchange must exist (its name carries the level count),
its level-0 queue must have the arguments the options give, and, where the
management API answers, the queue acted on must be bound to that chain. When
neither ``--prefix`` (nor ``$DELAYED_RETRY_PREFIX``) nor ``--levels`` is given
and the queue is bound to exactly one chain, that chain is used; an option
given is never overridden: a queue bound to another chain is refused, naming
both.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import replace

import aiormq
from aio_pika.abc import AbstractConnection

from delayed_retry.admin.chain_probe import declared_queue, exchange_exists
from delayed_retry.admin.management import BEST_EFFORT_TIMEOUT, ManagementClient, ManagementError
from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.chain.topology import DelayTopology, amqp_arguments
from delayed_retry.cli import common, output

__all__ = ["bound_chains", "checked_topology"]

_DELIVERY = re.compile(r"^(?P<prefix>.+)\.delivery-(?P<levels>\d+)$")


async def bound_chains(client: ManagementClient, queue: str) -> list[tuple[str, int]] | None:
    """``(prefix, levels)`` of every chain ``queue`` is bound to; ``None`` if unknowable.

    Bindings cannot be read over AMQP: this asks the management API and gives
    ``None`` when it cannot be read (not enabled, not reachable, the queue
    missing): the check it serves is skipped then, not failed.
    """
    try:
        bindings = await client.queue_bindings(queue)
    except ManagementError:
        return None
    found = set()
    for binding in bindings:
        match = _DELIVERY.match(binding.source)
        if match:
            found.add((match["prefix"], int(match["levels"])))
    return sorted(found)


async def _levels_of(connection: AbstractConnection, prefix: str) -> int | None:
    for levels in range(1, 49):
        if await exchange_exists(connection, f"{prefix}.delivery-{levels}"):
            return levels
    return None


def _options(prefix: str, levels: int) -> str:
    return f"--prefix {prefix} --levels {levels}"


async def checked_topology(
    connection: AbstractConnection, args: argparse.Namespace, *, queue: str | None = None
) -> DelayTopology:
    """The topology the options describe, once the broker shows it is the one in use.

    Raises :class:`CommandError` naming the mismatch and the options to pass.
    """
    topology = common.topology_from_args(args)
    given = bool(
        args.prefix
        or os.environ.get("DELAYED_RETRY_PREFIX")
        or getattr(args, "levels", None) is not None
    )
    if queue is not None:
        client = common.management_client(args, timeout=BEST_EFFORT_TIMEOUT)
        chains = await bound_chains(client, queue)
        if chains is not None and (topology.prefix, topology.levels) not in chains:
            if len(chains) == 1 and not given:
                prefix, levels = chains[0]
                topology = replace(topology, prefix=prefix, levels=levels)
            elif chains:
                shown = "; ".join(_options(p, n) for p, n in chains)
                raise output.CommandError(
                    f"queue {queue!r} is bound to the delay chain of {shown}, not to "
                    f"{_options(topology.prefix, topology.levels)}; pass the options of the "
                    "chain its consumers use (or set DELAYED_RETRY_PREFIX)"
                )
    if not await exchange_exists(connection, topology.delivery_exchange):
        found = await _levels_of(connection, topology.prefix)
        if found is not None:
            raise output.CommandError(
                f"the delay chain {topology.prefix!r} on this vhost has {found} levels, not "
                f"{topology.levels}; pass --levels {found}"
            )
        raise output.CommandError(
            f"there is no delay chain {topology.prefix!r} on this vhost (exchange "
            f"{topology.delivery_exchange!r} is missing); pass the --prefix your consumers use "
            "(or set DELAYED_RETRY_PREFIX), or create the chain with "
            f"'delayed-retry declare {_options(topology.prefix, topology.levels)}'"
        )
    spec = topology.queues()[0]
    if await declared_queue(connection, spec.name) is not None:
        # Re-declaring with the same arguments changes nothing; other arguments are refused.
        underlay = await underlay_channel(await connection.channel(publisher_confirms=False))
        try:
            await underlay.queue_declare(
                spec.name, durable=True, arguments=dict(amqp_arguments(spec.arguments))
            )
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            raise output.CommandError(
                f"the delay chain {topology.prefix!r} was declared with another unit or queue "
                f"type than --unit-ms {topology.unit_ms} --queue-type {topology.queue_type} "
                f"(the broker said: {exc.args[0] if exc.args else exc}); pass the options your "
                "consumers use"
            ) from None
        finally:
            if not underlay.is_closed:
                await underlay.close()
    return topology
